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


@dataclass(frozen=True)
class LocalPacs:
    config: pacs.PacsConfig
    specs: tuple[phantom.PhantomSpec, ...]
    series_dirs: dict[str, Path]  # phantom name -> its DICOM series folder
    uids: dict[str, tuple[str, str]]  # phantom name -> (study, series) UIDs


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
    proc = pacs.start(config)
    try:
        for folder in dirs:
            pacs.upload(config, sorted(folder.glob("*.dcm")))
        yield LocalPacs(config, PACS_SPECS, {s.name: d for s, d in zip(PACS_SPECS, dirs)},
                        {s.name: series_uids(phantom.make_phantom(s)) for s in PACS_SPECS})
    finally:
        pacs.stop(proc)
