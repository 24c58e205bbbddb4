"""A phantom handed to a bundle's transforms as MONAI's image loaders would hand it over, without a file.

Lets training and benchmarks run the bundle's own transforms on machines without ITK (the GPU machine), by dropping
only the loader from the transform list.
"""

from __future__ import annotations

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import LoadImaged

from rocm_zoo.phantom import Phantom


def as_loaded(p: Phantom, array: np.ndarray | None = None) -> MetaTensor:
    """`array` (default the image) with the metadata a loader gives: affine, original affine, shape, no channel."""
    array = p.image if array is None else array
    meta = {
        "affine": torch.as_tensor(p.affine, dtype=torch.float64),
        "original_affine": p.affine.copy(),
        "spatial_shape": np.array(array.shape),
        "original_channel_dim": "no_channel",
        "filename_or_obj": p.spec.name,
    }
    return MetaTensor(torch.as_tensor(array, dtype=torch.float32), meta=meta)


def without_loaders(transforms) -> list:
    return [t for t in transforms if not isinstance(t, LoadImaged)]


def loaders_without_reader(parser) -> None:
    """Drop a named reader (the bundles name ITKReader) from every LoadImaged of the config, so parsing works where
    that reader's library is not installed; `without_loaders` then removes the loaders themselves."""
    for key, value in list(parser.get().items()):
        if not isinstance(value, list):
            continue
        for i, item in enumerate(value):
            if isinstance(item, dict) and str(item.get("_target_", "")).endswith("LoadImaged") and "reader" in item:
                parser[f"{key}#{i}#reader"] = None
