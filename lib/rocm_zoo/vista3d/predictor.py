"""What VISTA3D's inferer calls instead of the warm network: fixed class-head shapes, and the image encoder's output
kept per (image, window) for clicks.

Class prompts: the class head is compiled for a fixed number of classes, and the number a client asks for varies
(one organ, a handful, OHIF's all-but-a-few, the 117 of "everything"). Prompts of more than one class are padded to
`class_bucket` (repeats of the first class; the head embeds each class on its own, so padding changes nothing) and the
padded maps are dropped again before stitching. Two class-head shapes then serve every prompt: 1 and the bucket.

Clicks run only the windows around them, and a clinician clicks again and again on one image; OHIF sends all of a
segment's points with every click, so every earlier point's window comes again. Three of VISTA3D's submodules compute
from the image window alone (the class head from it and the class asked for), so their outputs are kept per (image,
window), bounded in bytes, and a later click on that window skips them:
- the image encoder (both branches, as the forward asks for them),
- the class head (OHIF's clicks come with a class),
- the point head's downsampling of the encoder output (`point_head.feat_downsample`).
What depends on the points (the rest of the point head, the connected components) runs every time. VISTA3D's own reuse
hook (`image_embeddings` with `keep_cache=True`) serves clicks without a class only and keeps one image; hence the
wrappers (`CachingSubmodule`, put on the pooled module once by `rocm_zoo.vista3d.install`). Whole-volume prompts are
not cached: they touch every window once and would push the clicked windows out.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Hashable, Iterator

import torch
from torch import nn

from rocm_zoo.engine.lru import StreamCache
from rocm_zoo.engine.pool import WarmNetwork
from rocm_zoo.engine.scheduler import device_turn

# A full-size VISTA3D window with a class (OHIF's click) keeps about 470 MB in bf16, by its shapes: the encoder's two
# branches, 48 x 128^3 values each (201 MB), the downsampled point features (128 x 64^3, 67 MB) and the class head's
# map (4 MB). This keeps the last eight such windows (a segment of eight points); the tiny sample's are 9 MiB.
EMBEDDING_CACHE_BYTES = 4 * 2**30


class EmbeddingCache(StreamCache[Hashable, Any]):
    """Least recently used submodule outputs (tensors, or tuples of tensors and None), bounded in bytes; the newest
    entry is always kept. Made by a click or a warm-up, on its stream, read on another's."""

    def __init__(self, max_bytes: int = EMBEDDING_CACHE_BYTES):
        super().__init__(max_bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def _tensors_mapped(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`fn` applied to every tensor of a submodule's output (a tensor, or a tuple of tensors and None)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_tensors_mapped(v, fn) for v in value)
    return fn(value) if torch.is_tensor(value) else value


class ThreadWindows:
    """The (image, window) each thread's forward works on. Per thread: clicks of two clients may run the shared module
    at once, each on its own stream (engine.streams)."""

    def __init__(self):
        self._keys: dict[int, Hashable] = {}

    @property
    def current(self) -> Hashable | None:
        return self._keys.get(threading.get_ident())

    @contextlib.contextmanager
    def working_on(self, key: Hashable) -> Iterator[None]:
        self._keys[threading.get_ident()] = key
        try:
            yield
        finally:
            self._keys.pop(threading.get_ident(), None)


class CachingSubmodule(nn.Module):
    """Stands in for one of VISTA3D's submodules: while this thread works on an (image, window), the submodule's output
    for it (and for the arguments `arguments` names) comes from the cache when it is there, and goes into it when it
    is not. Outside a window it is the submodule itself."""

    def __init__(self, module: nn.Module, cache: EmbeddingCache, windows: ThreadWindows, name: str,
                 arguments: Callable[..., Hashable], copied: bool = False):
        super().__init__()
        self.module = module
        self.cache = cache
        self.windows = windows
        self.name = name
        self.arguments = arguments
        self.copied = copied  # the caller edits the output in place: it gets a copy of what is kept

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        window = self.windows.current
        if window is None:
            return self.module(*args, **kwargs)
        key = (window, self.name, self.arguments(*args, **kwargs))
        out = self.cache.get(key)
        if out is None:
            out = self.module(*args, **kwargs)
            self.cache.put(key, _tensors_mapped(out, torch.Tensor.detach))
        return _tensors_mapped(out, torch.Tensor.clone) if self.copied else out


def _encoder_branches(input_images, with_point: bool = True, with_label: bool = True) -> Hashable:
    return with_point, with_label


def _classes(src, class_vector: torch.Tensor) -> Hashable:
    return tuple(class_vector.reshape(-1).tolist())


def _nothing(*args: Any) -> Hashable:
    return ()


# (submodule path, what besides the window its output depends on, copied). The forward edits the class head's logits
# in place (`connected_components_combine`), so they are handed out as copies.
CACHED_SUBMODULES = (
    ("image_encoder", _encoder_branches, False),
    ("class_head", _classes, True),
    ("point_head.feat_downsample", _nothing, False),
)


# One cache per loaded network: outputs belong to its weights, so a reloaded network starts empty and one whose
# weights were swapped in place is emptied (while requests wait for the swap).
_CACHES: weakref.WeakKeyDictionary[nn.Module, EmbeddingCache] = weakref.WeakKeyDictionary()
_WINDOWS: weakref.WeakKeyDictionary[nn.Module, ThreadWindows] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def embedding_cache(network: WarmNetwork) -> EmbeddingCache:
    with _CACHES_LOCK:
        cache = _CACHES.get(network.eager)
        if cache is None:
            cache = _CACHES[network.eager] = EmbeddingCache()
            network.after_swap(cache.clear)
        return cache


def route_window_caches(network: WarmNetwork) -> ThreadWindows:
    """The pooled module's cached submodules, each wrapped once (compiled ones stay inside, warm); the windows its
    threads work on."""
    module = network.eager
    cache = embedding_cache(network)
    with _CACHES_LOCK:
        windows = _WINDOWS.setdefault(module, ThreadWindows())
        for path, arguments, copied in CACHED_SUBMODULES:
            parent_path, _, name = path.rpartition(".")
            parent = module.get_submodule(parent_path)
            if not isinstance(getattr(parent, name), CachingSubmodule):
                setattr(parent, name, CachingSubmodule(getattr(parent, name), cache, windows, path, arguments, copied))
        return windows


def _routed_windows(network: WarmNetwork) -> ThreadWindows | None:
    with _CACHES_LOCK:
        return _WINDOWS.get(network.eager)


class VistaPredictor:
    def __init__(self, network: WarmNetwork, class_bucket: int, image_key: Hashable | None = None):
        self.network = network
        self.class_bucket = class_bucket
        self.image_key = image_key
        self.embeddings = embedding_cache(network)

    def __getattr__(self, name: str) -> Any:
        # Bundle inferers look at the network they are given (`point_head.last_supported`).
        if name.startswith("__") or name in ("network", "class_bucket", "image_key", "embeddings", "turn"):
            raise AttributeError(name)
        return getattr(self.network, name)

    def __call__(self, x: torch.Tensor, *args: Any, class_vector: torch.Tensor | None = None,
                 point_coords: torch.Tensor | None = None, patch_coords=None, **kwargs: Any) -> torch.Tensor:
        if patch_coords is not None:  # the window inferer names it; the sliding window passes it second, by position
            kwargs["patch_coords"] = patch_coords
        if class_vector is not None and point_coords is None and 1 < len(class_vector) < self.class_bucket:
            return self._padded_classes(x, *args, class_vector=class_vector, **kwargs)
        if point_coords is not None and patch_coords is not None and self.image_key:
            return self._with_cached_window(x, *args, class_vector=class_vector, point_coords=point_coords, **kwargs)
        return self.network(x, *args, class_vector=class_vector, point_coords=point_coords, **kwargs)

    def turn(self):
        """One turn on the device for several runs (a click's windows): the runs inside take no turns of their own."""
        return device_turn(self.network.backend.device)

    def _padded_classes(self, x, *args, class_vector: torch.Tensor, **kwargs) -> torch.Tensor:
        n = len(class_vector)
        padded = torch.cat([class_vector, class_vector[:1].expand(self.class_bucket - n, *class_vector.shape[1:])])
        out = self.network(x, *args, class_vector=padded, **kwargs)
        # one map per class: along dim 1 when the forward transposes for an inferer ([1, classes, ...]), else dim 0
        return out[:, :n] if kwargs.get("transpose") else out[:n]

    def _with_cached_window(self, x, *args, **kwargs) -> torch.Tensor:
        window = tuple((s.start, s.stop) for s in kwargs["patch_coords"][0][-3:])
        windows = _routed_windows(self.network)
        if windows is None:
            raise RuntimeError("VISTA3D's submodules are not routed to the embedding cache on this network: call "
                               "rocm_zoo.vista3d.install(network, inferer) before the predictor runs")
        # The window is this thread's state on the shared module: set, run, cleared, in one turn on the device.
        with device_turn(self.network.backend.device), windows.working_on((self.image_key, window)):
            return self.network(x, *args, **kwargs)
