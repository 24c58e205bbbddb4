"""Shared fixtures: a sample datastore and bundle in a temp folder, and a real MONAI Label server on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests

from rocm_zoo import phantom
from rocm_zoo.sample import SamplePaths, write_bundles, write_studies
from zoo_test_support import LPS_SPEC, REPO

SERVER_START_TIMEOUT_S = 900


@dataclass(frozen=True)
class SampleEnv:
    root: Path
    app_dir: Path
    paths: SamplePaths
    specs: tuple[phantom.PhantomSpec, ...]

    def truth(self, image_id: str) -> np.ndarray:
        import nibabel as nib

        return np.asarray(nib.load(self.paths.truth / f"{image_id}.nii.gz").dataobj)

    def image_path(self, image_id: str) -> Path:
        return self.paths.studies / f"{image_id}.nii.gz"


@pytest.fixture(scope="session")
def sample_env(tmp_path_factory) -> SampleEnv:
    root = tmp_path_factory.mktemp("rocm_zoo")
    app_dir = root / "app"
    shutil.copytree(REPO / "apps" / "rocm_zoo", app_dir, ignore=shutil.ignore_patterns("model", "__pycache__"))
    paths = SamplePaths(studies=root / "studies", truth=root / "truth", model_dir=app_dir / "model")
    specs = tuple(phantom.test_specs()) + (LPS_SPEC,)
    write_studies(paths, list(specs))
    write_bundles(paths.model_dir, "tiny")
    return SampleEnv(root, app_dir, paths, specs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(sample_env: SampleEnv):
    """`monailabel start_server --app ... --studies ... --conf models all`, on a free loopback port."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = sample_env.root / "server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(sample_env.root / "inductor"))
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(sample_env.app_dir),
           "--studies", str(sample_env.paths.studies), "--conf", "models", "all",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=sample_env.root)
    deadline = time.time() + SERVER_START_TIMEOUT_S
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
                pytest.fail(f"server not up after {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()[-5000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
