"""Honest sample bundles, one module per Model Zoo bundle; the registry names each bundle's module (`sample`).

Each module mirrors its bundle's inference config (network class and parameters, transforms, inferer settings) and
has the same interface:
- `NAME`: the bundle's folder name, as downloaded from the Model Zoo;
- `write_files(bundle_dir, size)`: configs, metadata and the bundle's own `scripts` (and any non-weight data files);
- `random_weights(size, seed)`: seeded untrained weights, by file inside the bundle (e.g. "models/model.pt");
- `build_network(size)`: the network exactly as the config builds it, for tests and training.
`tiny` runs on a CPU in tests; `full` is the real network size for GPU benchmarks. Neither is a clinical model.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import ModuleType

from rocm_zoo.errors import ConfigError
from rocm_zoo.registry import BUNDLES
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles.common import SIZES, is_sample, write_torch

logger = logging.getLogger(__name__)


def _sample_modules() -> dict[str, ModuleType]:
    modules = {}
    for entry in BUNDLES.values():
        if not entry.sample:
            continue
        module = importlib.import_module(f"{__name__}.{entry.sample}")
        if module.NAME != entry.name:
            raise ConfigError(f"Sample module {module.__name__} writes '{module.NAME}', the registry names it for "
                              f"'{entry.name}'")
        modules[entry.name] = module
    return modules


SAMPLE_BUNDLES: dict[str, ModuleType] = _sample_modules()

__all__ = ["SAMPLE_BUNDLES", "SIZES", "training_labels", "write_sample_bundle"]

# The phantom's organs by each bundle's label names, for the labels its train config learns from (the rest of the
# phantom is background). VISTA3D's upstream train.json fine-tunes on MSD Task09 (spleen 1, the rest 0).
_TRAIN_ORGANS = {
    "spleen_deepedit_annotation": {"spleen": "spleen"},
    "wholeBody_ct_segmentation": {"spleen": "spleen", "right_kidney": "kidney_right", "left_kidney": "kidney_left",
                                  "liver": "liver", "aorta": "aorta", "pancreas": "pancreas"},
    "swin_unetr_btcv_segmentation": {"spleen": "spleen", "right_kidney": "Right Kidney", "left_kidney": "Left Kideny",
                                     "liver": "Liver", "aorta": "Aorta", "pancreas": "Pancreas"},
    "pancreas_ct_dints_segmentation": {"pancreas": "pancreas"},
    "vista3d": {"spleen": "spleen"},
}
_TRAIN_NUMBERS = {"spleen_deepedit_annotation": {"spleen": 1}, "pancreas_ct_dints_segmentation": {"pancreas": 1},
                  "vista3d": {"spleen": 1}}


def training_labels(bundle: str) -> dict[int, int]:
    """Phantom label value (phantom.ORGAN_LABELS) -> the number the bundle's train config uses for that organ."""
    names = getattr(SAMPLE_BUNDLES[bundle], "LABELS", None)
    numbers = _TRAIN_NUMBERS.get(bundle) or {name: i for i, name in enumerate(names)}
    return {phantom.ORGAN_LABELS[organ]: numbers[name] for organ, name in _TRAIN_ORGANS[bundle].items()}


def write_sample_bundle(model_dir: Path, bundle: str | ModuleType, size: str, weights: dict[str, dict] | None = None,
                        seed: int = 0) -> Path:
    """Write (or replace) a sample bundle (by name, or its module); `weights` (by file) default to seeded random
    ones. A real bundle already there is kept as it is."""
    module = SAMPLE_BUNDLES[bundle] if isinstance(bundle, str) else bundle
    bundle = Path(model_dir) / module.NAME
    if not is_sample(bundle):
        logger.warning("%s holds a real (non-sample) bundle: kept, no sample written", bundle)
        return bundle
    module.write_files(bundle, size)
    for rel, state in (weights or module.random_weights(size, seed)).items():
        write_torch(bundle / rel, state)
    return bundle
