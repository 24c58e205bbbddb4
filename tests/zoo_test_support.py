"""What test modules share besides fixtures. A plain module with its own name: test modules import it, never
`conftest` (tests/dicomweb has a conftest of its own, and pytest imports both under the one name `conftest`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import requests

from rocm_zoo import phantom

REPO = Path(__file__).resolve().parents[1]
# An LPS-stored, anisotropic phantom: clicks and masks must land right whatever the storage orientation.
LPS_SPEC = phantom.PhantomSpec("phantom_lps", (100, 92, 38), (4.0, 4.2, 5.0), seed=1_000_123, orientation="LPS")


def flatten_config(tree, prefix: str = "") -> dict:
    """A bundle config as MONAI's `#` paths -> values (lists of plain values stay values): to compare two configs key
    by key."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten_config(sub, f"{prefix}{key}#").items()}
    if isinstance(tree, list) and any(isinstance(x, dict) for x in tree):
        return {k: v for i, sub in enumerate(tree) for k, v in flatten_config(sub, f"{prefix}{i}#").items()}
    return {prefix[:-1]: tree}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def monailabel_server(app_dir: Path, studies: str, models: str, log_path: Path, cwd: Path, timeout_s: float,
                      env: dict[str, str]) -> Iterator[str]:
    """`monailabel start_server --app APP --studies STUDIES --conf models MODELS` on a free loopback port, with `env`
    added to the environment; yields its URL once `/info/` answers, stops it afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(app_dir), "--studies", studies,
           "--conf", "models", models, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **env))
    deadline = time.time() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
            try:
                if requests.get(f"{url}/info/", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.time() > deadline:
                pytest.fail(f"server not up after {timeout_s} s:\n{log_path.read_text()[-5000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
