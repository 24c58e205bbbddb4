"""One local Orthanc (DICOMweb on loopback) per test session, loaded with small phantoms as CT series."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from rocm_zoo import pacs, phantom
from rocm_zoo.dicom_series import series_uids
from rocm_zoo.sample import write_dicom_studies

# Small enough for CPU tests; LPS-stored so geometry mistakes cannot cancel out.
PACS_SPECS = (phantom.PhantomSpec("pacs_ras", (64, 60, 24), (5.0, 5.2, 6.0), seed=2_000_001),
              phantom.PhantomSpec("pacs_lps", (60, 64, 22), (5.2, 5.0, 6.0), seed=2_000_002, orientation="LPS"))


@dataclass
class LocalPacs:
    config: pacs.PacsConfig
    specs: tuple[phantom.PhantomSpec, ...]
    series_dirs: dict[str, Path]  # phantom name -> its DICOM series folder
    uids: dict[str, tuple[str, str]]  # phantom name -> (study, series) UIDs
    process: object = None

    def restart(self) -> None:
        """Starts Orthanc again on the same port and storage (after a test stopped it)."""
        self.process = pacs.start(self.config)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def local_pacs(tmp_path_factory) -> LocalPacs:
    try:
        pacs.check_installed()
    except pacs.PacsError as e:
        pytest.skip(f"no local PACS: {e}")
    root = tmp_path_factory.mktemp("pacs")
    config = pacs.PacsConfig(folder=root / "orthanc", http_port=free_port())
    dirs = write_dicom_studies(root / "dicom", list(PACS_SPECS))
    local = LocalPacs(config, PACS_SPECS, {s.name: d for s, d in zip(PACS_SPECS, dirs)},
                      {s.name: series_uids(phantom.make_phantom(s)) for s in PACS_SPECS}, pacs.start(config))
    try:
        for folder in dirs:
            pacs.upload(config, sorted(folder.glob("*.dcm")))
        yield local
    finally:
        pacs.stop(local.process)


PACS_MODELS = "wholeBody_ct,vista3d"  # vista3d for the browser test's point prompt


@dataclass(frozen=True)
class PacsServer:
    url: str
    cache_dir: Path  # MONAI_LABEL_DICOMWEB_CACHE_PATH: downloaded series and their conversions
    log: Path

    def converted(self, series: str) -> Path | None:
        hits = list(self.cache_dir.rglob(f"{series}.nii.gz"))
        return hits[0] if hits else None


@pytest.fixture(scope="session")
def pacs_server(local_pacs, sample_env):
    """`monailabel start_server --studies <Orthanc DICOMweb>` with the rocm_zoo app, on a free loopback port."""
    import os
    import subprocess
    import sys
    import time

    import requests

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    root = sample_env.root / f"pacs_server_{port}"
    root.mkdir()
    log_path = root / "server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(sample_env.root / "inductor"),
               MONAI_LABEL_DICOMWEB_CACHE_PATH=str(root / "dicom-cache"))
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(sample_env.app_dir),
           "--studies", local_pacs.config.dicomweb_url, "--conf", "models", PACS_MODELS,
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    deadline = time.time() + 600
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
                pytest.fail(f"server not up after 600 s:\n{log_path.read_text()[-5000:]}")
            time.sleep(1)
        yield PacsServer(url, root / "dicom-cache", log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
