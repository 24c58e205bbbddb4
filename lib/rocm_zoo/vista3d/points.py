"""Clicks from the image as stored to the image VISTA3D sees: the full affine chain, never a ratio of shapes.

A client clicks voxel (i, j, k) of the image as it is stored (Slicer and OHIF both send voxel indices of the file or
series they display). The bundle then resamples to 1.5 mm, crops to the foreground and reorients to RAS; each of
these moves the voxel grid in the world, and the preprocessed image's affine records where it ended up. So a stored
voxel goes to the world through the stored affine and back into the preprocessed grid through the inverse of the
current one. Scaling by the ratio of the shapes is right only without crop and without a flip (an LPS-stored image
is flipped in x and y by the reorientation), which is why it is not used.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def stored_to_preprocessed(points: Sequence[Sequence[float]] | torch.Tensor, original_affine, current_affine
                           ) -> torch.Tensor:
    """[N, 3] voxel coordinates of the stored image -> [N, 3] voxel coordinates (float64) of the preprocessed one.
    `original_affine` is the stored image's voxel-to-world matrix, `current_affine` the preprocessed image's."""
    original = _affine(original_affine)
    current = _affine(current_affine)
    to_current = torch.linalg.inv(current) @ original
    pts = torch.as_tensor(points, dtype=torch.float64).reshape(-1, 3).cpu()
    homogeneous = torch.cat([pts, torch.ones(len(pts), 1, dtype=torch.float64)], dim=1)
    return (homogeneous @ to_current.T)[:, :3]


def image_affines(image) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored, current) affines of a preprocessed MetaTensor: its loader keeps the file's affine as
    `original_affine`; every spatial transform since updated `affine`."""
    meta = image.meta
    if "original_affine" not in meta:
        raise ValueError("the image has no 'original_affine' in its metadata: it was not loaded by MONAI's LoadImage")
    return _affine(meta["original_affine"]), _affine(image.affine)


def _affine(a) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a.cpu() if torch.is_tensor(a) else a), dtype=torch.float64)
    if t.ndim == 3:  # a batch of one, as a DataLoader collates it
        t = t[0]
    if t.shape != (4, 4):
        raise ValueError(f"expected a 4x4 affine, got shape {tuple(t.shape)}")
    return t
