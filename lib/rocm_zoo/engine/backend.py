"""Which accelerator this process runs on and what it supports. Detection returns data; `describe` prints it.

One policy for ROCm, CUDA and CPU: the overlay asks for bf16 and compile everywhere; what the machine
cannot do falls back to fp32 / eager with one logged reason, never a crash and never silently.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# AMD's settings for MONAI on Instinct (FACTS.md 2b). MIOpen and Inductor read them when they initialise, so they
# must be in the environment before the first convolution; `setdefault` keeps whatever the user exported.
ROCM_ENV_DEFAULTS: dict[str, str] = {
    "PYTORCH_MIOPEN_SUGGEST_NHWC": "1",
    "MIOPEN_FIND_MODE": "1",
    "MIOPEN_FIND_ENFORCE": "4",
    "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "1",
    "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1",
    "TORCHINDUCTOR_EPILOGUE_FUSION": "1",
    "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN,TRITON",
}


@dataclass(frozen=True)
class Backend:
    kind: str  # "rocm", "cuda" or "cpu"
    device: str  # normalised torch device string, e.g. "cuda:0" or "cpu"
    device_name: str
    torch_version: str
    runtime_version: str  # HIP or CUDA version; "" on CPU
    conv_library: str  # "MIOpen", "cuDNN 91900", "oneDNN"
    bf16: bool
    compile: bool
    fallbacks: tuple[str, ...] = field(default=())  # why something the overlay asked for is off

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32


def is_out_of_memory(error: BaseException) -> bool:
    """Did an allocation fail? A GPU's allocator raises torch.OutOfMemoryError; the CPU's raises a plain RuntimeError
    (DefaultCPUAllocator), and numpy a MemoryError, so a volume too large for host memory needs this test too."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(error))


def normalise_device(device: str | torch.device | None) -> str:
    """"cuda", "cuda:0" and torch.device('cuda') are one device: one warm network, not two copies."""
    if device is None or str(device) in ("", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            return "cpu"
        return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"
    return d.type


def _compiler_available() -> tuple[bool, str]:
    if not hasattr(torch, "compile"):
        return False, "this torch has no torch.compile"
    if os.environ.get("ROCM_ZOO_COMPILE", "1") == "0":
        return False, "ROCM_ZOO_COMPILE=0"
    return True, ""


def detect_backend(device: str | None = None, *, want_bf16: bool = True, want_compile: bool = True) -> Backend:
    dev = normalise_device(device)
    fallbacks: list[str] = []
    if dev.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(dev))
        hip = getattr(torch.version, "hip", None)
        kind = "rocm" if hip else "cuda"
        runtime = hip or (torch.version.cuda or "")
        conv = "MIOpen" if hip else f"cuDNN {torch.backends.cudnn.version()}"
        name = props.name
        bf16_ok = torch.cuda.is_bf16_supported()
        if want_bf16 and not bf16_ok:
            fallbacks.append(f"bf16 off: {name} has no native bf16 support")
    else:
        kind, runtime, name = "cpu", "", "CPU"
        conv = "oneDNN" if torch.backends.mkldnn.is_available() else "native"
        bf16_ok = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        if want_bf16 and not bf16_ok:
            fallbacks.append("bf16 off: this CPU has no native bf16 (AVX512-BF16/AMX); fp32 is faster here")
    compile_ok, why = _compiler_available()
    if want_compile and not compile_ok:
        fallbacks.append(f"compile off: {why}")
    return Backend(
        kind=kind,
        device=dev,
        device_name=name,
        torch_version=torch.__version__,
        runtime_version=runtime,
        conv_library=conv,
        bf16=want_bf16 and bf16_ok,
        compile=want_compile and compile_ok,
        fallbacks=tuple(fallbacks),
    )


def env_defaults(backend: Backend) -> dict[str, str]:
    """The environment this backend wants before its first kernel runs. Only ROCm has any."""
    return dict(ROCM_ENV_DEFAULTS) if backend.kind == "rocm" else {}


def apply_env_defaults(backend: Backend, environ: dict | None = None) -> dict[str, str]:
    """Set the backend's defaults where the user has not set them; returns what was set."""
    environ = os.environ if environ is None else environ
    applied = {k: v for k, v in env_defaults(backend).items() if k not in environ}
    environ.update(applied)
    if backend.kind == "rocm":
        # hipBLASLt is the fast GEMM path on Instinct; on ROCm torch maps "cublaslt" to it.
        torch.backends.cuda.preferred_blas_library("cublaslt")
    return applied


def describe(backend: Backend) -> str:
    parts = [
        f"backend={backend.kind}",
        f"device={backend.device} ({backend.device_name})",
        f"torch={backend.torch_version}",
    ]
    if backend.runtime_version:
        parts.append(f"{'hip' if backend.kind == 'rocm' else 'cuda'}={backend.runtime_version}")
    parts += [f"conv={backend.conv_library}", f"dtype={'bfloat16' if backend.bf16 else 'float32'}"]
    parts.append(f"compile={'on' if backend.compile else 'off'}")
    line = " ".join(parts)
    return line + "".join(f"; {f}" for f in backend.fallbacks)


def use_persistent_compile_cache(path: Path) -> None:
    """Compiled kernels next to the bundles rather than in /tmp, so a restart (even after a reboot) reuses them.
    Inductor writes its /tmp default into the environment the first time anything asks for it (some imports do), so
    that default counts as unset; a value the user chose is kept."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
