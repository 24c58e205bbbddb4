"""The server's own warm-up volume: a CT-like body with one organ-shaped blob and a click point in it.

The warm-up needs every reader, transform, network shape and writer a request meets, not anatomy; this volume is
enough for that and keeps the server free of the sample phantoms (rocm_zoo.samples is never imported at run time).
Its grids are those the warm-up has always used, so the compiled shapes stay the same: the 96x96x40 test grid at
~4.2 x 4.2 x 5 mm, and for VISTA3D a small LPS-stored 40x32x12 grid at 4 x 4 x 5 mm (4 windows of the tiny
sample's 64^3 patch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rocm_zoo.engine.masks import central_voxel


@dataclass(frozen=True)
class WarmGrid:
    shape: tuple[int, int, int]  # voxels (x, y, z)
    spacing: tuple[float, float, float]  # mm
    orientation: str = "RAS"  # how the voxels are stored: "RAS" or "LPS" (x and y flipped)


DEFAULT_GRID = WarmGrid((96, 96, 40), (4.17, 4.17, 5.0))
VISTA3D_GRID = WarmGrid((40, 32, 12), (4.0, 4.0, 5.0), "LPS")

AIR_HU, FAT_HU, SOFT_TISSUE_HU, ORGAN_HU, NOISE_HU = -1000.0, -100.0, 40.0, 110.0, 15.0
BODY_MM = (170.0, 125.0)  # in-plane semi-axes of the body, centred on the volume
FAT_MM = 15.0  # subcutaneous fat
ORGAN_CENTRE_MM, ORGAN_RADII_MM = (-95.0, -30.0, 5.0), (45.0, 28.0, 50.0)  # RAS, where a spleen lies


@dataclass(frozen=True, eq=False)
class WarmVolume:
    image: np.ndarray  # int16 HU, as stored
    affine: np.ndarray  # voxel -> RAS mm
    click: list[int]  # a voxel inside the organ, as clients send clicks (indices of the stored image)

    def clicks(self, count: int) -> list[list[int]]:
        """`count` clicks: `click`, then the voxels after it along the first axis (inside the image)."""
        last = self.image.shape[0] - 1
        return [[min(self.click[0] + i, last), *self.click[1:]] for i in range(count)]

    def write(self, path: Path) -> None:
        """NIfTI, as a datastore holds a study."""
        import nibabel as nib

        img = nib.Nifti1Image(self.image, self.affine)
        img.set_qform(self.affine, code=1)
        img.set_sform(self.affine, code=1)
        img.header.set_xyzt_units("mm", "sec")
        nib.save(img, str(path))


def make_warm_volume(grid: WarmGrid = DEFAULT_GRID, seed: int = 0) -> WarmVolume:
    n, d = np.asarray(grid.shape), np.asarray(grid.spacing, dtype=np.float64)
    affine = np.diag([*d, 1.0])
    affine[:3, 3] = -(n - 1) / 2.0 * d  # centred on world 0
    x, y, z = (np.arange(k) * dk + ok for k, dk, ok in zip(n, d, affine[:3, 3]))
    x, y, z = x[:, None, None], y[None, :, None], z[None, None, :]
    a, b = BODY_MM
    body = (x / a) ** 2 + (y / b) ** 2 <= 1.0
    inner = (x / (a - FAT_MM)) ** 2 + (y / (b - FAT_MM)) ** 2 <= 1.0
    (cx, cy, cz), (rx, ry, rz) = ORGAN_CENTRE_MM, ORGAN_RADII_MM
    organ = inner & (((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 + ((z - cz) / rz) ** 2 <= 1.0)
    image = np.full(grid.shape, AIR_HU, np.float32)
    image[np.broadcast_to(body, grid.shape)] = FAT_HU
    image[np.broadcast_to(inner, grid.shape)] = SOFT_TISSUE_HU
    image[organ] = ORGAN_HU
    image += NOISE_HU * np.random.default_rng(seed).standard_normal(grid.shape, dtype=np.float32)
    image = np.clip(np.rint(image), -1024, 3071).astype(np.int16)
    if grid.orientation == "LPS":
        flip = np.array([[-1, 0, 0, n[0] - 1], [0, -1, 0, n[1] - 1], [0, 0, 1, 0], [0, 0, 0, 1]], np.float64)
        affine = affine @ flip
        image, organ = np.ascontiguousarray(image[::-1, ::-1]), organ[::-1, ::-1]
    click = central_voxel(organ) if organ.any() else [s // 2 for s in grid.shape]
    return WarmVolume(image, affine, click)

