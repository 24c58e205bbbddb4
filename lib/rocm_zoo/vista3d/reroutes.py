"""Every call of MONAI's or the VISTA3D bundle's that rocm_zoo sends elsewhere, set up in one step: `install`.

| call                                    | made by                           | goes to                        | set up per  |
|-----------------------------------------|-----------------------------------|--------------------------------|-------------|
| `keep_merge_components_with_points`,    | the network's forward, the        | `components` (GPU tensors      | process     |
| `keep_components_with_positive_points`  | bundle's post transform           | without cuCIM)                 |             |
| `point_based_window_inferer`            | the bundle's inferer              | `window` (stitched on device)  | inferer     |
| `image_encoder`, `class_head`,          | the network's forward             | `predictor.CachingSubmodule`   | network     |
| `point_head.feat_downsample`            |                                   | (kept per window)              |             |
| `torch.cuda.empty_cache`                | the network's forward             | nothing                        | network     |

VISTA3D's forward calls `torch.cuda.empty_cache()` on every call (MONAI's training-time habit): it hands the
allocator's free blocks back to the driver, so the next window allocates them again from the driver, which
synchronises the device. The network's forward therefore runs with the allocator's cache kept.

Each step looks whether it is done already, so `install` is cheap on every request, and a network built anew (weights
reloaded) or an inferer whose bundle scripts were imported afresh is routed the first time it is used.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterator

import torch

from rocm_zoo.engine.pool import WarmNetwork
from rocm_zoo.vista3d import components, predictor, window

_NETWORK_LOCK = threading.Lock()  # two tasks (OHIF's and Slicer's) share one network and may route it at once


def install(network: WarmNetwork, inferer: Any) -> None:
    """Routes MONAI's component steps, `inferer`'s point window inferer, and `network`'s cached submodules and cache
    emptying."""
    components.route_monai()
    window.route_inferer(inferer)
    with _NETWORK_LOCK:
        predictor.route_window_caches(network)
        keep_allocator_cache(network)


def _keep_cache() -> None:
    pass


_kept_lock = threading.Lock()
_kept_depth = 0  # runs inside `allocator_cache_kept` now, in every thread
_empty_cache = None  # torch's own, while swapped out


@contextlib.contextmanager
def allocator_cache_kept() -> Iterator[None]:
    """`torch.cuda.empty_cache` does nothing inside. Counted: the first run in swaps it out, the last one out puts it
    back, so nested or concurrent runs (two devices) restore it once; a call from elsewhere meanwhile only skips a
    memory hint."""
    global _kept_depth, _empty_cache
    with _kept_lock:
        if _kept_depth == 0:
            _empty_cache, torch.cuda.empty_cache = torch.cuda.empty_cache, _keep_cache
        _kept_depth += 1
    try:
        yield
    finally:
        with _kept_lock:
            _kept_depth -= 1
            if _kept_depth == 0:
                torch.cuda.empty_cache = _empty_cache


def keep_allocator_cache(network: WarmNetwork) -> None:
    """The pooled module's forward, wrapped once to run inside `allocator_cache_kept` (looked up at each call)."""
    module = network.eager
    forward = module.forward
    if getattr(forward, "rocm_zoo_keeps_allocator_cache", False):
        return

    @functools.wraps(forward)
    def kept(*args: Any, **kwargs: Any) -> Any:
        with allocator_cache_kept():
            return forward(*args, **kwargs)

    kept.rocm_zoo_keeps_allocator_cache = True
    module.forward = kept
