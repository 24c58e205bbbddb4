"""One local Orthanc (DICOMweb on loopback) per test session, loaded with small phantoms as CT series."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from rocm_zoo.bench import pacs

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import series_uids
from rocm_zoo.samples.write import write_dicom_studies
from zoo_test_support import free_port, monailabel_server
from pacs_unavailable import unavailable

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


@pytest.fixture(scope="session")
def local_pacs(tmp_path_factory) -> LocalPacs:
    try:
        pacs.check_installed()
    except pacs.PacsError as e:
        unavailable(f"no local PACS: {e}")
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
    root = sample_env.root / "pacs_server"
    root.mkdir()
    log_path = root / "server.log"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor"),
           "MONAI_LABEL_DICOMWEB_CACHE_PATH": str(root / "dicom-cache")}
    with monailabel_server(sample_env.app_dir, local_pacs.config.dicomweb_url, PACS_MODELS, log_path, cwd=root,
                           timeout_s=900, env=env) as url:  # as tests/conftest.py: warm-up compiles on a busy CPU
        yield PacsServer(url, root / "dicom-cache", log_path)
