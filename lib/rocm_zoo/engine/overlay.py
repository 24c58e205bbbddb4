"""Read a bundle's own config merged with its rocm_zoo overlay, and apply the overlay's settings to a network.

The overlay (`rocm_zoo/engine/overlays/<bundle>/inference_rocm.json`, package data) is plain MONAI config merged over
the bundle's config with MONAI's rules (files in order, later keys win, `+key` appends). Its `rocm_overlay` block is
the data this module reads; its `network` and `evaluator#...` keys wire the same data into the bundle's own
`python -m monai.bundle run` workflow, so one file serves both the server and the bundle CLI.
"""

from __future__ import annotations

import importlib.resources
import logging
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from monai.bundle import ConfigParser
from torch import nn

from rocm_zoo.engine.gemm_transpose import enable_gemm_transpose
from rocm_zoo.errors import ConfigError
from rocm_zoo.names import did_you_mean

logger = logging.getLogger(__name__)

OVERLAY_FILE = "inference_rocm.json"
# The overlays ship inside the package (a wheel has no checkout to find them in); a plain folder on disk once installed.
OVERLAYS_DIR = Path(str(importlib.resources.files("rocm_zoo.engine") / "overlays"))
SETTINGS_KEY = "rocm_overlay"
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last_3d": torch.channels_last_3d}
AMP_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STITCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class OverlaySettings:
    """What the overlay asks for. Defaults are the bundle as shipped: fp32, contiguous, eager."""

    memory_format: str = "contiguous"
    amp_dtype: str = "float32"
    compile: bool = False
    compile_mode: str | None = None  # torch.compile mode: None (default), "max-autotune", ...
    gemm_transpose: bool = False
    # Compile these submodules (attribute paths) instead of the whole network: for networks whose forward has
    # data-dependent control flow around compute-heavy parts (VISTA3D: image encoder, class head, point transformer).
    compile_submodules: tuple[str, ...] | None = None
    # Of those, the ones whose input shapes vary from request to request (VISTA3D's point transformer: one token per
    # click). Compiled with dynamic shapes after the second shape seen, so a new click count reuses the graph instead of
    # recompiling; the others keep their shapes fixed.
    compile_dynamic: tuple[str, ...] = ()
    # Let cuDNN (MIOpen on ROCm) time its convolution algorithms for each new shape and keep the fastest. Safe here
    # because the shapes are fixed and warmed; a process-wide switch, so every overlay of a server should agree.
    cudnn_benchmark: bool = False
    # Precision of a sliding window's stitching buffer (MONAI stitches in the dtype of the inferer's input). float16
    # halves the largest allocation of a many-class model (wholeBody: 105 channels over the resampled volume) and
    # keeps 11 bits of mantissa for the blended logits; the argmax is compared against fp32 in the benchmark.
    stitch_dtype: str = "float32"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> OverlaySettings:
        known = [f.name for f in fields(cls)]
        for key in raw:
            if key not in known:
                hint = did_you_mean(key, known)
                raise ConfigError(f"Unknown key '{key}' in the '{SETTINGS_KEY}' overlay block.{hint} Known: {known}")
        raw = dict(raw)
        subs = raw.get("compile_submodules")
        if subs is not None:
            if isinstance(subs, str) or not all(isinstance(n, str) and n for n in subs):
                raise ConfigError("'compile_submodules' must be null or a list of submodule names")
            raw["compile_submodules"] = tuple(subs)
        dynamic = raw.get("compile_dynamic", ())
        if isinstance(dynamic, str) or not all(isinstance(n, str) and n for n in dynamic):
            raise ConfigError("'compile_dynamic' must be a list of submodule names")
        raw["compile_dynamic"] = tuple(dynamic)
        unknown = set(raw["compile_dynamic"]) - set(raw.get("compile_submodules") or ())
        if unknown:
            raise ConfigError(f"'compile_dynamic' names {sorted(unknown)}, which 'compile_submodules' does not list")
        settings = cls(**raw)
        for flag in ("compile", "gemm_transpose", "cudnn_benchmark"):
            if not isinstance(getattr(settings, flag), bool):
                raise ConfigError(f"'{flag}' in the '{SETTINGS_KEY}' block must be true or false (JSON booleans)")
        if settings.compile_mode is not None and not isinstance(settings.compile_mode, str):
            raise ConfigError(f"'compile_mode' must be null or a torch.compile mode name, not {settings.compile_mode!r}")
        if settings.memory_format not in MEMORY_FORMATS:
            raise ConfigError(f"memory_format must be one of {list(MEMORY_FORMATS)}, not '{settings.memory_format}'")
        if settings.stitch_dtype not in STITCH_DTYPES:
            raise ConfigError(f"stitch_dtype must be one of {list(STITCH_DTYPES)}, not '{settings.stitch_dtype}'")
        if settings.amp_dtype not in AMP_DTYPES:
            raise ConfigError(f"amp_dtype must be one of {list(AMP_DTYPES)}, not '{settings.amp_dtype}'")
        return settings


BASELINE = OverlaySettings()


def overlay_path(overlays_dir: Path, bundle_name: str) -> Path:
    return Path(overlays_dir) / bundle_name / OVERLAY_FILE


# Held while a bundle's config is instantiated: `scripts` is one module name shared by every bundle, so two bundles
# (or a background warm-up and a request) must not resolve it at the same time.
BUNDLE_IMPORT_LOCK = threading.RLock()


@contextmanager
def bundle_on_path(bundle_dir: Path) -> Iterator[None]:
    """Bundles import their own `scripts` package by that name, so the bundle root goes first on sys.path, and any
    `scripts` another bundle imported before is forgotten."""
    root = str(bundle_dir)
    with BUNDLE_IMPORT_LOCK:
        for name in [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")]:
            del sys.modules[name]
        sys.path.insert(0, root)
        try:
            yield
        finally:
            sys.path.remove(root)


def load_config(bundle_dir: Path, config_rel: str, overlays: Sequence[Path] = ()) -> ConfigParser:
    """The bundle's config with the overlays merged over it in order. `bundle_root` points at the bundle."""
    files = [str(Path(bundle_dir) / config_rel)] + [str(o) for o in overlays]
    for f in files:
        if not Path(f).is_file():
            raise ConfigError(f"Config file {f} does not exist")
    parser = ConfigParser()
    parser.read_config(files)
    parser["bundle_root"] = str(bundle_dir)
    return parser


def read_settings(parser: ConfigParser) -> OverlaySettings:
    raw = parser.get(SETTINGS_KEY)
    return BASELINE if raw is None else OverlaySettings.from_dict(dict(raw))


def prepare_network(network: nn.Module, settings: OverlaySettings | dict, device: str | torch.device) -> nn.Module:
    """Move to the device, then apply the layout changes of the overlay (GEMM transpose, memory format).

    Does not compile: compiling is the caller's last step, after weights are loaded (a compiled module's state-dict
    keys gain an `_orig_mod.` prefix and a non-strict load would silently keep random weights).
    """
    if isinstance(settings, dict):  # called from the overlay's `network` expression with the raw block
        settings = OverlaySettings.from_dict(settings)
    network = network.to(device)
    if settings.gemm_transpose:
        enable_gemm_transpose(network)
    return network.to(memory_format=MEMORY_FORMATS[settings.memory_format])


def compile_network(network: nn.Module, settings: OverlaySettings | dict) -> nn.Module:
    """Compile in place (`nn.Module.compile`): the module object, its state-dict keys and every reference to it stay
    the same, so it can be called from the bundle's `initialize` after the checkpoint is loaded. Returns the module."""
    if isinstance(settings, dict):
        settings = OverlaySettings.from_dict(settings)
    if not settings.compile:
        return network
    for name, module in submodules_to_compile(network, settings):
        module.compile(mode=settings.compile_mode, dynamic=None if name in settings.compile_dynamic else False)
    return network


def submodules_to_compile(network: nn.Module, settings: OverlaySettings) -> list[tuple[str, nn.Module]]:
    """(attribute path, module) of each module to compile; the whole network has the path ""."""
    if settings.compile_submodules is None:
        return [("", network)]
    try:
        return [(name, network.get_submodule(name)) for name in settings.compile_submodules]
    except AttributeError as e:
        raise ConfigError(f"compile_submodules: {e} (in {type(network).__name__})") from e


def load_weights(network: nn.Module, weights: Path) -> None:
    """Strict load of a bundle's `model.pt` (a state dict, or a dict holding one under "model")."""
    network.load_state_dict(read_state_dict(weights), strict=True)


def read_state_dict(weights: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in a weights file, unwrapped. `mmap`: tensors are read when touched (keys and shapes only)."""
    return unwrap_state_dict(torch.load(weights, map_location="cpu", weights_only=True, mmap=mmap))


def is_wrapped(checkpoint: Any) -> bool:
    """Some Model Zoo bundles save `{"model": state_dict}` (the trainer's checkpoint dict) instead of the state dict."""
    return isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict)


def unwrap_state_dict(checkpoint: Any) -> dict[str, torch.Tensor]:
    return checkpoint["model"] if is_wrapped(checkpoint) else checkpoint
