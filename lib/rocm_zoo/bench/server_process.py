"""The rocm_zoo MONAI Label server as a child process on a free loopback port: for the tests and the OHIF and load
benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def monailabel_server(app_dir: Path, studies: str, models: str, log_path: Path, cwd: Path, timeout_s: float,
                      env: dict[str, str], conf: dict[str, str] | None = None, ready: bool = True) -> Iterator[str]:
    """`monailabel start_server --app APP --studies STUDIES --conf models MODELS` (and `--conf KEY VALUE` for each of
    `conf`) on a free loopback port, with `env` added to the environment; yields its URL once `/health/ready` says its
    interactive models are warm (`ready=False`: once it answers at all, models possibly still warming), stops it
    afterwards."""
    with monailabel_server_process(app_dir, studies, models, log_path, cwd, timeout_s, env, conf, ready) as (url, _):
        yield url


@contextmanager
def monailabel_server_process(app_dir: Path, studies: str, models: str, log_path: Path, cwd: Path, timeout_s: float,
                              env: dict[str, str], conf: dict[str, str] | None = None, ready: bool = True
                              ) -> Iterator[tuple[str, subprocess.Popen]]:
    """`monailabel_server`, yielding the server process (MONAI Label serves in the process it starts) with its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(app_dir), "--studies", studies,
           "--conf", "models", models, "--host", "127.0.0.1", "--port", str(port)]
    for key, value in (conf or {}).items():
        cmd += ["--conf", key, value]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **env))
    deadline = time.time() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise ServerStartError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
            try:
                if requests.get(f"{url}{'/health/ready' if ready else '/health/live'}", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or busy warming its models
                pass
            if time.time() > deadline:
                raise ServerStartError(f"server not up after {timeout_s} s:\n{log_path.read_text()[-5000:]}")
            time.sleep(1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_warm(url: str, timeout_s: float) -> dict[str, str]:
    """Waits until every model is warm (automatic ones warm in the background after the server answers), so the
    first timed request times the request, not a compile; returns `/info`'s `rocm_zoo.warm`."""
    deadline = time.time() + timeout_s
    while True:
        warm = requests.get(f"{url}/info/", timeout=30).json()["rocm_zoo"]["warm"]
        failed = {k: v for k, v in warm.items() if v.startswith("failed")}
        if failed:
            raise RuntimeError(f"models failed to warm: {failed}")
        if warm and all(v.startswith("warm (") for v in warm.values()):  # {} until the app starts warming
            return warm
        if time.time() > deadline:
            raise TimeoutError(f"models not warm after {timeout_s:.0f} s: {warm}")
        time.sleep(2)
