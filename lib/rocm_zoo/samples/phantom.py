"""Deterministic synthetic abdominal CT phantoms in Hounsfield units, with organ truth masks.

Anatomy is defined in RAS+ world millimetres (nibabel convention: +x is the patient's RIGHT,
+y anterior, +z superior), so a seed gives the same anatomy at any shape or spacing.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from rocm_zoo.engine.atomic_files import atomic_write

ORGAN_LABELS: dict[str, int] = {
    "spleen": 1, "right_kidney": 2, "left_kidney": 3, "liver": 4, "aorta": 5,
    "pancreas": 6, "spine": 7, "muscle": 8, "fat": 9,
}
_L = ORGAN_LABELS
# Nominal HU per label (air is label 0). Spleen is brighter than liver, as in portal-venous phase.
NOMINAL_HU: dict[int, float] = {
    0: -1000.0, _L["spleen"]: 110.0, _L["right_kidney"]: 150.0, _L["left_kidney"]: 150.0,
    _L["liver"]: 60.0, _L["aorta"]: 250.0, _L["pancreas"]: 45.0, _L["spine"]: 500.0,
    _L["muscle"]: 50.0, _L["fat"]: -100.0,
}
_VISCERAL_FAT_HU = -90.0
_CORTEX_HU, _CORTEX_MM = 900.0, 2.5
_NOISE_HU = 15.0
_BLUR_VOXELS = (0.6, 0.6, 0.4)  # partial-volume blur; z is already averaged over the thick slice
_TEST_SHAPES = ((96, 96, 40), (104, 104, 38), (112, 104, 36))
_TEST_SEED0, _TRAIN_SEED0 = 1_000_000, 100


@dataclass(frozen=True)
class PhantomSpec:
    """What to generate: file stem, voxel grid (x, y, z), spacing in mm, seed and storage orientation."""

    name: str
    shape: tuple[int, int, int]
    spacing: tuple[float, float, float]
    seed: int
    orientation: str = "RAS"

    def __post_init__(self) -> None:
        if self.orientation not in ("RAS", "LPS"):
            raise ValueError(f"orientation must be 'RAS' or 'LPS', not {self.orientation!r}")
        if len(self.shape) != 3 or len(self.spacing) != 3:
            raise ValueError("shape and spacing must have three entries")


@dataclass(frozen=True, eq=False)
class Phantom:
    """A generated phantom: int16 HU image, uint8 truth labels and the voxel-to-RAS-mm affine."""

    spec: PhantomSpec
    image: np.ndarray
    truth: np.ndarray
    affine: np.ndarray


@dataclass(frozen=True)
class _Blob:
    """An ellipsoid (elliptic cylinder when rz is inf) in RAS mm: yawed in the axial plane,
    bent along its first axis (centre line v = bend * u**2) and wobbled by smooth sine waves."""

    label: int
    center: tuple[float, float, float]
    radii: tuple[float, float, float]
    yaw_deg: float = 0.0
    bend: float = 0.0
    wobble: float = 0.0
    waves: tuple[tuple[float, float, float, float], ...] = ()
    in_cavity: bool = True  # clip to the abdominal cavity, else only to the body
    cortex: bool = False  # bright rim (bone cortex)


SPLEEN10 = PhantomSpec("phantom_spleen10", (512, 512, 55), (0.98, 0.98, 5.0), seed=10)
# A whole-body-length CT at thin slices: the size at which wholeBody's upstream stitching needs ~28.7 GB.
CT512X397 = PhantomSpec("phantom_ct512x397", (512, 512, 397), (0.78, 0.78, 1.25), seed=397)


def _anatomy(seed: int) -> tuple[dict[str, float], list[_Blob]]:
    """Body outline parameters and the organs, in painting order (later ones win)."""
    rng = np.random.default_rng([seed, 0])

    def j(value: float, rel: float = 0.1) -> float:
        return float(value * (1.0 + rng.uniform(-rel, rel)))

    def s(mm: float = 8.0) -> float:
        return float(rng.uniform(-mm, mm))

    def waves() -> tuple[tuple[float, float, float, float], ...]:
        return tuple((*rng.normal(0.0, 1.3, 3).tolist(), float(rng.uniform(0, 2 * math.pi))) for _ in range(3))

    body = {"a": j(170, 0.08), "b": j(125, 0.08), "fat": rng.uniform(10, 25), "muscle": rng.uniform(8, 14),
            "phase": rng.uniform(0, 2 * math.pi)}
    sy = -0.42 * body["b"]  # vertebral body centre
    inf = math.inf
    m, sp = _L["muscle"], _L["spine"]
    blobs = [
        _Blob(m, (32 + s(3), sy - 38, 0), (j(24), j(20), inf), in_cavity=False),  # paraspinal muscles
        _Blob(m, (-32 + s(3), sy - 38, 0), (j(24), j(20), inf), in_cavity=False),
        _Blob(_L["liver"], (j(80) + s(), j(10) + s(), 20 + s()), (j(75), j(75), j(85)), -15 + s(10), 0.0,
              0.08, waves()),
        _Blob(_L["liver"], (-10 + s(), 50 + s(), 35 + s()), (j(55), j(28), j(40)), 10 + s(5), 0.0, 0.1, waves()),
        _Blob(_L["pancreas"], (-20 + s(), s(5), -5 + s()), (j(55), j(11), j(14)), 17 + s(5), -0.004,
              0.1, waves()),
        _Blob(_L["right_kidney"], (j(72) + s(4), sy + 7 + s(4), -30 + s()), (j(28), j(22), j(55)), 30 + s(8),
              0.006, 0.05, waves()),
        _Blob(_L["left_kidney"], (-j(72) + s(4), sy + 7 + s(4), -20 + s()), (j(28), j(22), j(55)), -30 + s(8),
              0.006, 0.05, waves()),
        _Blob(_L["spleen"], (-j(104), -j(32), 10 + s(5)), (j(50), j(28), j(52)), -62 + s(8), 0.008, 0.12, waves()),
        _Blob(_L["aorta"], (-15 + s(3), sy + 32 + s(3), 0), (j(11), j(11), inf)),
        _Blob(sp, (0, sy, 0), (j(22, 0.05), j(17, 0.05), inf), in_cavity=False, cortex=True),
        _Blob(sp, (0, sy - 35, 0), (j(5, 0.05), j(14, 0.05), inf), in_cavity=False, cortex=True),  # spinous process
    ]
    return body, blobs


def _axes(spec: PhantomSpec) -> tuple[np.ndarray, list[np.ndarray]]:
    """RAS affine (volume centred on world 0) and the world coordinate of every index along x, y, z."""
    n, d = np.asarray(spec.shape), np.asarray(spec.spacing, dtype=np.float64)
    affine = np.diag([*d, 1.0])
    affine[:3, 3] = -(n - 1) / 2.0 * d
    return affine, [(np.arange(k) * dk + ok).astype(np.float32) for k, dk, ok in zip(n, d, affine[:3, 3])]


def _paint_body(body: dict[str, float], x, y, z, labels, image) -> np.ndarray:
    """Subcutaneous fat, muscle wall and visceral fat; returns the abdominal cavity mask."""
    scale = 1.0 + 0.04 * np.sin(2 * math.pi * z / 400.0 + body["phase"])  # slow change along z
    ay, power = np.abs(y)[:, None], np.where(y < 0, 2.6, 2.0)[:, None]  # flatter back: patient on the table

    def inside(inset: float) -> np.ndarray:
        a, b = body["a"] * scale - inset, body["b"] * scale - inset
        return ((x[:, None] / a) ** 2)[:, None, :] + ((ay / b) ** power)[None] <= 1.0

    for inset, label, hu in ((0.0, _L["fat"], NOMINAL_HU[_L["fat"]]),
                             (body["fat"], _L["muscle"], NOMINAL_HU[_L["muscle"]]),
                             (body["fat"] + body["muscle"], _L["fat"], _VISCERAL_FAT_HU)):
        mask = inside(inset)
        labels[mask], image[mask] = label, hu
    return mask


def _paint(blob: _Blob, x, y, z, labels, image, cavity) -> None:
    """Paint one blob, evaluating it only inside its bounding box."""
    (cx, cy, cz), (ru, rv, rw) = blob.center, blob.radii
    grow = 1.0 + blob.wobble
    ext = (max(ru, rv) + abs(blob.bend) * ru * ru) * grow
    box = tuple(slice(np.searchsorted(ax, c - e), np.searchsorted(ax, c + e, "right"))
                for ax, c, e in ((x, cx, ext), (y, cy, ext), (z, cz, rw * grow)))
    if any(b.start >= b.stop for b in box):
        return
    dx, dy = (x[box[0]] - cx)[:, None, None], (y[box[1]] - cy)[None, :, None]
    c, s = math.cos(math.radians(blob.yaw_deg)), math.sin(math.radians(blob.yaw_deg))
    u_mm = c * dx + s * dy
    u, v = u_mm / ru, (c * dy - s * dx - blob.bend * u_mm**2) / rv
    w = (z[box[2]] - cz)[None, None, :] / rw if math.isfinite(rw) else np.zeros((1, 1, 1), np.float32)
    q = u * u + v * v + w * w
    if blob.wobble:
        f = sum(np.sin(kx * u + ky * v + kz * w + ph) for kx, ky, kz, ph in blob.waves) / len(blob.waves)
        q = q / (1.0 + blob.wobble * f) ** 2
    allowed = cavity[box] if blob.in_cavity else labels[box] != 0
    mask = (q <= 1.0) & allowed
    labels[box][mask] = blob.label
    image[box][mask] = NOMINAL_HU[blob.label]
    if blob.cortex:
        inner = (1.0 - _CORTEX_MM / min(ru, rv)) ** 2
        image[box][mask & (q > inner)] = _CORTEX_HU


def make_phantom(spec: PhantomSpec) -> Phantom:
    """Generate the phantom for ``spec``; the same spec always gives identical arrays."""
    affine, (x, y, z) = _axes(spec)
    labels = np.zeros(spec.shape, np.uint8)
    image = np.full(spec.shape, NOMINAL_HU[0], np.float32)
    body, blobs = _anatomy(spec.seed)
    cavity = _paint_body(body, x, y, z, labels, image)
    for blob in blobs:
        _paint(blob, x, y, z, labels, image, cavity)
    del cavity
    image = ndimage.gaussian_filter(image, _BLUR_VOXELS, mode="nearest")
    noise = np.random.default_rng([spec.seed, 1]).standard_normal(spec.shape, dtype=np.float32)
    noise *= _NOISE_HU
    image += noise
    del noise
    np.rint(image, out=image)
    np.clip(image, -1024, 3071, out=image)
    image = image.astype(np.int16)
    if spec.orientation == "LPS":
        # Same world anatomy: flip the stored x and y axes and move the origin to the other corner.
        nx, ny = spec.shape[:2]
        flip = np.array([[-1, 0, 0, nx - 1], [0, -1, 0, ny - 1], [0, 0, 1, 0], [0, 0, 0, 1]], np.float64)
        affine = affine @ flip
        image, labels = np.ascontiguousarray(image[::-1, ::-1]), np.ascontiguousarray(labels[::-1, ::-1])
    return Phantom(spec, image, labels, affine)


def _save_atomic(img: nib.Nifti1Image, path: Path) -> None:
    data = img.to_bytes()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1, mtime=0)  # nibabel's own level for .nii.gz
    atomic_write(path, lambda out: out.write(data), mode=0o644)  # the served sample data must stay readable


def write_phantom(phantom: Phantom, image_path: Path, truth_path: Path) -> None:
    """Write image and truth as NIfTI, each atomically (engine.atomic_files)."""
    for data, path in ((phantom.image, image_path), (phantom.truth, truth_path)):
        img = nib.Nifti1Image(data, phantom.affine)
        img.set_qform(phantom.affine, code=1)
        img.set_sform(phantom.affine, code=1)
        img.header.set_xyzt_units("mm", "sec")
        _save_atomic(img, Path(path))


def test_specs(count: int = 3) -> list[PhantomSpec]:
    """Small specs for CPU tests: ~400 mm field of view in-plane, 5 mm slices, distinct seeds."""
    specs = []
    for i in range(count):
        shape = _TEST_SHAPES[i % len(_TEST_SHAPES)]
        spacing = (round(400 / shape[0], 2), round(400 / shape[1], 2), 5.0)
        specs.append(PhantomSpec(f"phantom_test{i}", shape, spacing, seed=_TEST_SEED0 + i))
    return specs


test_specs.__test__ = False  # keep pytest from collecting it if imported by name


def training_specs(count: int) -> list[PhantomSpec]:
    """Small training specs: seeds disjoint from test_specs, varied grid and field of view."""
    if count > _TEST_SEED0 - _TRAIN_SEED0:
        raise ValueError("too many training specs: seeds would overlap the test seeds")
    specs = []
    for i in range(count):
        seed = _TRAIN_SEED0 + i
        rng = np.random.default_rng([seed, 2])
        nx = int(rng.choice([96, 104, 112, 128]))
        ny = nx - 8 * int(rng.integers(0, 2))
        fov = rng.uniform(400, 460)  # wider than the widest body (~385 mm)
        sz = float(rng.choice([4.0, 5.0]))
        nz = math.ceil(rng.uniform(195, 230) / sz)  # keeps the whole spleen inside in z
        spacing = (round(fov / nx, 2), round(fov / ny, 2), sz)
        specs.append(PhantomSpec(f"phantom_train{i}", (nx, ny, nz), spacing, seed=seed))
    return specs
