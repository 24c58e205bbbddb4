"""`rocm-zoo sample`: the sample datastore (synthetic CT phantoms) and the sample bundles.

Studies go to the datastore folder; their truth masks go to a separate folder, so MONAI Label never mistakes them
for annotations. Paths come from the caller; the defaults are relative to the current folder, laid out as a checkout
is (sample-data/, apps/rocm_zoo/model). The tiny bundles' weights are the committed, phantom-trained ones, shipped
as package data (rocm_zoo/samples/weights): DeepEdit's made by `--train`, the others' by `rocm-zoo train-sample`.
"""

from __future__ import annotations

import importlib.resources
import logging
import site
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rocm_zoo.registry import APP_DIR
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import SAMPLE_BUNDLES, deepedit, write_sample_bundle
from rocm_zoo.samples.bundles.common import is_sample
from rocm_zoo.samples.train_sample import committed_weights

logger = logging.getLogger(__name__)

TRAINED_WEIGHTS = Path(str(importlib.resources.files("rocm_zoo.samples") / "weights" / f"{deepedit.NAME}-tiny.pt"))


@dataclass(frozen=True)
class SamplePaths:
    studies: Path
    truth: Path
    model_dir: Path


def default_paths() -> SamplePaths:
    here = Path.cwd()
    return SamplePaths(
        studies=here / "sample-data" / "studies",
        truth=here / "sample-data" / "truth",
        model_dir=here / APP_DIR / "model",
    )


def installed(path: Path) -> bool:
    """Whether `path` lies inside an installed environment (site-packages), not a source tree."""
    path = Path(path).resolve()
    roots = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages(), sys.prefix]}
    return any(root == path or root in path.parents for root in roots)


def write_studies(paths: SamplePaths, specs: list[phantom.PhantomSpec]) -> list[Path]:
    paths.studies.mkdir(parents=True, exist_ok=True)
    paths.truth.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        image = paths.studies / f"{spec.name}.nii.gz"
        if not image.exists():
            phantom.write_phantom(phantom.make_phantom(spec), image, paths.truth / f"{spec.name}.nii.gz")
        written.append(image)
    return written


def write_dicom_studies(folder: Path, specs: list[phantom.PhantomSpec]) -> list[Path]:
    """Each phantom as a CT DICOM series in `folder/<name>/` (same anatomy and HU as its NIfTI); returns the folders.
    A complete series already there is kept."""
    from rocm_zoo.samples.dicom_series import write_series

    written = []
    for spec in specs:
        series = folder / spec.name
        if len(list(series.glob("*.dcm"))) != spec.shape[2]:
            write_series(phantom.make_phantom(spec), series)
        written.append(series)
    return written


def write_deepedit_bundle(model_dir: Path, size: str, train: bool = False, train_steps: int = 1000) -> Path:
    """Writes (or replaces) the sample bundle; a real bundle already there is kept as it is."""
    bundle = model_dir / deepedit.NAME
    if not is_sample(bundle):
        return write_sample_bundle(model_dir, deepedit.NAME, size)  # logs that it keeps the real one
    if train:
        from rocm_zoo.samples.deepedit_weights import train_deepedit

        # The full-size network is only trained where asked (on a GPU: a few minutes); the tiny one's weights are
        # committed, so training again replaces them.
        deepedit.write_files(bundle, size)
        state = train_deepedit(bundle, steps=train_steps, device="auto")
        if size == "tiny" and installed(TRAINED_WEIGHTS):
            # An installed package is not edited: the new weights are in the bundle only.
            logger.info("trained weights written to the bundle only (the packaged ones are in %s)", TRAINED_WEIGHTS)
        elif size == "tiny":
            TRAINED_WEIGHTS.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, TRAINED_WEIGHTS)
        return write_sample_bundle(model_dir, deepedit.NAME, size, {"models/model.pt": state})
    if size == "full":
        return write_sample_bundle(model_dir, deepedit.NAME, size)
    state = torch.load(TRAINED_WEIGHTS, map_location="cpu", weights_only=True)
    return write_sample_bundle(model_dir, deepedit.NAME, size, {"models/model.pt": state})


def write_bundles(model_dir: Path, size: str, names: tuple[str, ...] | None = None, train: bool = False,
                  train_steps: int = 1000) -> list[Path]:
    """The sample bundles named (default: all). Tiny ones get the committed phantom-trained weights; full ones seeded
    random (untrained) weights."""
    written = []
    for name in names or tuple(SAMPLE_BUNDLES):
        if name not in SAMPLE_BUNDLES:
            raise ValueError(f"No sample bundle '{name}'; there are: {', '.join(SAMPLE_BUNDLES)}")
        if name == deepedit.NAME:
            written.append(write_deepedit_bundle(model_dir, size, train, train_steps))
        else:
            weights = committed_weights(name) if size == "tiny" else None
            written.append(write_sample_bundle(model_dir, name, size, weights))
    return written


def make_samples(paths: SamplePaths, size: str = "tiny", spleen10: bool = True, train: bool = False,
                 train_steps: int = 1000, bundles: tuple[str, ...] | None = None, dicom: Path | None = None) -> None:
    specs = phantom.test_specs() + ([phantom.SPLEEN10] if spleen10 else [])
    for image in write_studies(paths, specs):
        logger.info("study %s", image)
    for series in write_dicom_studies(dicom, specs) if dicom else []:
        logger.info("DICOM series %s", series)
    for bundle in write_bundles(paths.model_dir, size, bundles, train=train, train_steps=train_steps):
        logger.info("bundle %s (%s)", bundle, size)

