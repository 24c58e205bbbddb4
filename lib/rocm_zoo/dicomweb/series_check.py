"""Is this downloaded DICOM series a CT volume the models can take? Checked from the headers before any conversion,
so a single slice, mixed frame sizes or orientations, gaps between slices, or more voxels than the server's volume
budget (rows x columns x frames, `--conf max_volume_voxels`) are refused with the reason."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from pydicom.dataset import Dataset

from rocm_zoo.engine.volume_check import check_dicom_budget
from rocm_zoo.errors import InvalidRequest

MIN_SLICES = 2
SPACING_TOLERANCE = 0.01  # relative: SimpleITK would silently resample a series with gaps onto a regular grid


def check_series(series_id: str, headers: Sequence[Dataset]) -> tuple[int, int, int]:
    """Returns (columns, rows, slices); raises InvalidRequest naming what is wrong."""
    what = f"series {series_id} is not a CT volume"
    if len(headers) < MIN_SLICES:
        raise InvalidRequest(f"{what}: it has {len(headers)} image(s); a volume needs at least {MIN_SLICES} slices")
    missing = [h.get("SOPInstanceUID", "?") for h in headers
               if "ImagePositionPatient" not in h or "ImageOrientationPatient" not in h or "Rows" not in h]
    if missing:
        raise InvalidRequest(f"{what}: {len(missing)} image(s) lack position, orientation or size (e.g. {missing[0]})")
    sizes = {(int(h.Rows), int(h.Columns)) for h in headers}
    if len(sizes) > 1:
        raise InvalidRequest(f"{what}: its images have different sizes {sorted(sizes)}")
    check_dicom_budget(f"series {series_id}", headers)
    rows, columns = next(iter(sizes))
    orientations = {tuple(round(float(v), 4) for v in h.ImageOrientationPatient) for h in headers}
    if len(orientations) > 1:
        raise InvalidRequest(f"{what}: its images have {len(orientations)} different orientations")
    iop = np.asarray(next(iter(orientations)), dtype=float)
    normal = np.cross(iop[:3], iop[3:])
    positions = np.sort([float(np.dot(normal, np.asarray(h.ImagePositionPatient, dtype=float))) for h in headers])
    steps = np.diff(positions)
    if np.any(steps < 1e-3):
        raise InvalidRequest(f"{what}: two or more images share one slice position")
    if steps.max() - steps.min() > SPACING_TOLERANCE * steps.mean():
        raise InvalidRequest(f"{what}: its slices are not evenly spaced ({steps.min():.3g} to {steps.max():.3g} mm)")
    return columns, rows, len(headers)
