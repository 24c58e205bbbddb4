"""A phantom handed to a bundle's transforms as MONAI's image loaders would hand it over, without a file.

Lets training and benchmarks run the bundle's own transforms on machines without ITK (the GPU machine), by dropping
only the loader from the transform list.
"""

from __future__ import annotations

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import LoadImaged

from rocm_zoo.samples.phantom import Phantom


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
    """Drop a named reader (the bundles name ITKReader) from every LoadImaged of the config, at any depth (a
    `Compose` keeps its list under `transforms`), so parsing works where that reader's library is not installed;
    `without_loaders` then removes the loaders themselves."""

    def walk(node, path: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in list(items):
            walk(v, f"{path}#{k}" if path else str(k))
        if isinstance(node, dict) and str(node.get("_target_", "")).endswith("LoadImaged") and "reader" in node:
            parser[f"{path}#reader"] = None

    walk(parser.get(), "")
