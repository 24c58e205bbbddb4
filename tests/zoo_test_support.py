"""What test modules share besides fixtures. A plain module with its own name: test modules import it, never
`conftest` (tests/dicomweb has a conftest of its own, and pytest imports both under the one name `conftest`)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from types import SimpleNamespace
from pathlib import Path
from typing import Iterator

import pytest
import requests

from rocm_zoo.samples import phantom

from rocm_zoo.bench import server_process
from rocm_zoo.bench.server_process import free_port  # noqa: F401 (tests import it from here)

REPO = Path(__file__).resolve().parents[1]
# An LPS-stored, anisotropic phantom: clicks and masks must land right whatever the storage orientation.
LPS_SPEC = phantom.PhantomSpec("phantom_lps", (100, 92, 38), (4.0, 4.2, 5.0), seed=1_000_123, orientation="LPS")
NO_NATIVE_BF16 = "bf16 rounding is shown only on a CPU with native bf16 (AVX512-BF16 or AMX)"


def skip_without_native_bf16() -> None:
    """Overlay-against-fp32 checks need bf16 to compare: without native bf16 the backend keeps the overlay in fp32
    (its logged fallback), so the check would bound no rounding (listed in CI_ALLOWED_SKIPS)."""
    from rocm_zoo.engine.backend import detect_backend

    if not detect_backend("cpu").bf16:
        pytest.skip(NO_NATIVE_BF16)


def flatten_config(tree, prefix: str = "") -> dict:
    """A bundle config as MONAI's `#` paths -> values (lists of plain values stay values): to compare two configs key
    by key."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten_config(sub, f"{prefix}{key}#").items()}
    if isinstance(tree, list) and any(isinstance(x, dict) for x in tree):
        return {k: v for i, sub in enumerate(tree) for k, v in flatten_config(sub, f"{prefix}{i}#").items()}
    return {prefix[:-1]: tree}


@contextmanager
def monailabel_server(app_dir: Path, studies: str, models: str, log_path: Path, cwd: Path, timeout_s: float,
                      env: dict[str, str], conf: dict[str, str] | None = None, ready: bool = True) -> Iterator[str]:
    """rocm_zoo.bench.server_process.monailabel_server; a server that does not come up fails the test with its log."""
    try:
        with server_process.monailabel_server(app_dir, studies, models, log_path, cwd, timeout_s, env, conf,
                                                  ready) as url:
            yield url
    except server_process.ServerStartError as e:
        pytest.fail(str(e))


def wait_all_warm(server: str, timeout_s: float = 900) -> dict:
    """Every model warm (or failed), automatic ones included: the compiled-graph count is the process's, so a test
    that counts graphs must not start while a background warm-up still compiles."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        warm = requests.get(f"{server}/health/ready", timeout=10).json()["models"]
        if all(state.split()[0] in ("warm", "failed:") for state in warm.values()):
            return warm
        time.sleep(2)
    pytest.fail(f"models still warming after {timeout_s} s: {warm}")


class EagerNetwork:
    """Stands in for the pool's WarmNetwork in unit tests: the module as `eager`, called without grad."""

    backend = SimpleNamespace(device="cpu")  # where a predictor takes its device turn

    def __init__(self, module):
        self.eager = module

    def __call__(self, x, *args, **kwargs):
        import torch

        with torch.no_grad():
            return self.eager(x, *args, **kwargs)

    def after_swap(self, hook) -> None:  # its weights are never swapped
        pass
