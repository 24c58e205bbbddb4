"""Shared fixtures: a sample datastore and bundle in a temp folder, and a real MONAI Label server on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rocm_zoo.samples import phantom
from rocm_zoo.samples.write import SamplePaths, write_bundles, write_studies
from rocm_zoo.server.app_folder import make_app_folder
from zoo_test_support import LPS_SPEC, monailabel_server

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
    make_app_folder(app_dir)
    paths = SamplePaths(studies=root / "studies", truth=root / "truth", model_dir=app_dir / "model")
    specs = tuple(phantom.test_specs()) + (LPS_SPEC,)
    write_studies(paths, list(specs))
    write_bundles(paths.model_dir, "tiny")
    return SampleEnv(root, app_dir, paths, specs)


@pytest.fixture(scope="session")
def server(sample_env: SampleEnv):
    """`monailabel start_server --app ... --studies ... --conf models all`, on a free loopback port."""
    with monailabel_server(sample_env.app_dir, str(sample_env.paths.studies), "all", sample_env.root / "server.log",
                           cwd=sample_env.root, timeout_s=SERVER_START_TIMEOUT_S,
                           env={"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor")}) as url:
        yield url
