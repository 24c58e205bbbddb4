"""Tests for accelerator detection (rocm_zoo.engine.backend). No GPU needed: torch's CUDA queries are monkeypatched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rocm_zoo.engine.backend import (
    ROCM_ENV_DEFAULTS,
    apply_env_defaults,
    describe,
    detect_backend,
    env_defaults,
    normalise_device,
)

ROCM_KEYS = {
    "PYTORCH_MIOPEN_SUGGEST_NHWC",
    "MIOPEN_FIND_MODE",
    "MIOPEN_FIND_ENFORCE",
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
    "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",
    "TORCHINDUCTOR_EPILOGUE_FUSION",
    "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS",
}


def _fake_gpu(monkeypatch, *, hip: str | None, name: str, bf16: bool = True, cudnn: int = 91900) -> None:
    """Make torch believe one GPU is present. `hip` set means a ROCm build (which still calls the device "cuda")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(name=name))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None if hip else "12.8", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: cudnn)


def _no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def _compile_env_unset(monkeypatch):
    """Each test starts from the default (compile allowed) whatever the developer's shell exported."""
    monkeypatch.delenv("ROCM_ZOO_COMPILE", raising=False)


@pytest.fixture
def blas_calls(monkeypatch) -> list[str]:
    """preferred_blas_library needs a real GPU; record the calls instead."""
    calls: list[str] = []
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda lib=None: calls.append(lib))
    return calls


# --- detection ------------------------------------------------------------------------------------------------------


def test_rocm_is_detected_from_torch_version_hip_on_the_cuda_device(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    b = detect_backend("cuda")
    assert b.kind == "rocm"
    assert b.device == "cuda:0"
    assert b.device_name == "AMD Instinct MI300X"
    assert b.conv_library == "MIOpen"
    assert b.runtime_version == "7.0.0"
    assert b.bf16 and b.dtype == torch.bfloat16
    assert b.compile
    assert b.fallbacks == ()


def test_cuda_is_detected_when_torch_has_no_hip(monkeypatch):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200", cudnn=91900)
    b = detect_backend("cuda:0")
    assert b.kind == "cuda"
    assert b.device == "cuda:0"
    assert b.device_name == "NVIDIA H200"
    assert b.conv_library == "cuDNN 91900"
    assert b.runtime_version == "12.8"
    assert b.fallbacks == ()


def test_auto_device_picks_the_gpu_when_there_is_one(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    assert detect_backend().device == "cuda:0"
    assert detect_backend("auto").kind == "rocm"


def test_cpu_is_chosen_when_there_is_no_gpu(monkeypatch):
    _no_gpu(monkeypatch)
    for request in (None, "auto", "cuda", "cpu"):
        b = detect_backend(request)
        assert b.kind == "cpu", request
        assert b.device == "cpu", request
        assert b.runtime_version == "", request
        assert b.conv_library in ("oneDNN", "native"), request


def test_detect_backend_cpu_on_the_real_machine():
    b = detect_backend("cpu")
    assert b.kind == "cpu"
    assert b.device == "cpu"
    assert b.device_name == "CPU"
    assert b.dtype in (torch.bfloat16, torch.float32)
    # Whatever this CPU supports, the answer is either bf16 on or an explained fallback.
    assert b.bf16 or any("bf16" in f for f in b.fallbacks)


# --- device names ---------------------------------------------------------------------------------------------------


def test_normalise_device_maps_every_spelling_of_the_first_gpu_to_cuda_0(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    spellings = ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), None, "auto", ""]
    assert {normalise_device(s) for s in spellings} == {"cuda:0"}


def test_normalise_device_keeps_an_explicit_gpu_index(monkeypatch):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200")
    assert normalise_device("cuda:1") == "cuda:1"


def test_normalise_device_uses_the_current_device_for_a_bare_cuda(monkeypatch):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert normalise_device("cuda") == "cuda:3"


def test_normalise_device_maps_cuda_to_cpu_without_a_gpu(monkeypatch):
    _no_gpu(monkeypatch)
    for s in ("cuda", "cuda:0", torch.device("cuda"), None, "auto", "cpu", torch.device("cpu")):
        assert normalise_device(s) == "cpu", s


# --- environment defaults -------------------------------------------------------------------------------------------


def test_env_defaults_hold_the_rocm_keys_only_for_rocm(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    rocm = detect_backend("cuda")
    assert ROCM_KEYS <= set(env_defaults(rocm))
    assert env_defaults(rocm)["PYTORCH_MIOPEN_SUGGEST_NHWC"] == "1"
    assert env_defaults(rocm)["MIOPEN_FIND_MODE"] == "1"
    assert env_defaults(rocm)["MIOPEN_FIND_ENFORCE"] == "4"
    assert env_defaults(rocm)["TORCHINDUCTOR_MAX_AUTOTUNE"] == "1"
    # The result is a copy: changing it does not change the module's table.
    env_defaults(rocm)["MIOPEN_FIND_MODE"] = "changed"
    assert ROCM_ENV_DEFAULTS["MIOPEN_FIND_MODE"] == "1"


def test_env_defaults_are_empty_for_cuda_and_cpu(monkeypatch):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200")
    assert env_defaults(detect_backend("cuda")) == {}
    assert env_defaults(detect_backend("cpu")) == {}


def test_apply_env_defaults_on_rocm_sets_missing_keys_and_keeps_the_users_value(monkeypatch, blas_calls):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    environ = {"MIOPEN_FIND_MODE": "3", "UNRELATED": "x"}
    applied = apply_env_defaults(detect_backend("cuda"), environ)

    assert environ["MIOPEN_FIND_MODE"] == "3"  # the user's choice wins
    assert "MIOPEN_FIND_MODE" not in applied
    assert environ["UNRELATED"] == "x"
    assert set(applied) == set(ROCM_ENV_DEFAULTS) - {"MIOPEN_FIND_MODE"}
    for key, value in ROCM_ENV_DEFAULTS.items():
        if key != "MIOPEN_FIND_MODE":
            assert environ[key] == value
    assert blas_calls == ["cublaslt"]


def test_apply_env_defaults_twice_sets_nothing_the_second_time(monkeypatch, blas_calls):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    environ: dict[str, str] = {}
    rocm = detect_backend("cuda")
    assert apply_env_defaults(rocm, environ) == ROCM_ENV_DEFAULTS
    assert apply_env_defaults(rocm, environ) == {}
    assert environ == ROCM_ENV_DEFAULTS


def test_apply_env_defaults_for_cuda_and_cpu_sets_nothing(monkeypatch, blas_calls):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200")
    for b in (detect_backend("cuda"), detect_backend("cpu")):
        environ = {"KEEP": "1"}
        assert apply_env_defaults(b, environ) == {}
        assert environ == {"KEEP": "1"}
    assert blas_calls == []


# --- fallbacks ------------------------------------------------------------------------------------------------------


def test_gpu_without_bf16_falls_back_to_fp32_with_one_reason(monkeypatch):
    _fake_gpu(monkeypatch, hip="6.2.0", name="AMD Instinct MI50", bf16=False)
    b = detect_backend("cuda")
    assert not b.bf16
    assert b.dtype == torch.float32
    assert len(b.fallbacks) == 1
    assert "bf16" in b.fallbacks[0]
    assert "AMD Instinct MI50" in b.fallbacks[0]
    text = describe(b)
    assert "dtype=float32" in text
    assert b.fallbacks[0] in text


def test_not_asking_for_bf16_is_not_a_fallback(monkeypatch):
    _fake_gpu(monkeypatch, hip="6.2.0", name="AMD Instinct MI50", bf16=False)
    b = detect_backend("cuda", want_bf16=False)
    assert not b.bf16
    assert b.fallbacks == ()


def test_rocm_zoo_compile_0_turns_compile_off_with_a_reason(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    monkeypatch.setenv("ROCM_ZOO_COMPILE", "0")
    b = detect_backend("cuda")
    assert not b.compile
    assert b.fallbacks == ("compile off: ROCM_ZOO_COMPILE=0",)
    assert "compile=off" in describe(b)
    assert "ROCM_ZOO_COMPILE=0" in describe(b)


def test_not_asking_for_compile_is_not_a_fallback(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    monkeypatch.setenv("ROCM_ZOO_COMPILE", "0")
    b = detect_backend("cuda", want_compile=False)
    assert not b.compile
    assert b.fallbacks == ()


def test_describe_names_backend_device_runtime_and_library(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.0", name="AMD Instinct MI300X")
    text = describe(detect_backend("cuda"))
    for part in ("backend=rocm", "device=cuda:0 (AMD Instinct MI300X)", "hip=7.0.0", "conv=MIOpen",
                 "dtype=bfloat16", "compile=on"):
        assert part in text
    assert ";" not in text  # no fallbacks, nothing appended

    _fake_gpu(monkeypatch, hip=None, name="NVIDIA H200")
    text = describe(detect_backend("cuda"))
    assert "backend=cuda" in text and "cuda=12.8" in text and "conv=cuDNN 91900" in text



def test_out_of_memory_is_recognised_from_every_allocator():
    from rocm_zoo.engine.backend import is_out_of_memory

    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2**50, dtype=torch.uint8)  # a petabyte: refused at once, nothing touched
    assert is_out_of_memory(cpu.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("Expected 5D input")) and not is_out_of_memory(ValueError("x"))
