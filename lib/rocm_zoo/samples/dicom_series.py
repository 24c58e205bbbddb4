"""A phantom as a CT DICOM series: one file per axial slice, in LPS patient coordinates, HU as signed 16-bit.

UIDs are derived from the phantom's name and seed, so writing the same phantom again gives the same study, series and
instances: loading it into a PACS twice replaces, never duplicates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import FileDataset

from rocm_zoo import dicom_volume
from rocm_zoo.engine.atomic_files import atomic_write
from rocm_zoo.samples.phantom import Phantom

_STUDY_DATE = "20260101"


def series_uids(phantom: Phantom) -> tuple[str, str]:
    """(StudyInstanceUID, SeriesInstanceUID) of the phantom's series."""
    return dicom_volume.series_uids(f"rocm_zoo/{phantom.spec.name}/{phantom.spec.seed}")


def lps_affine(affine_ras: np.ndarray) -> np.ndarray:
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ np.asarray(affine_ras, dtype=float)


def slice_datasets(phantom: Phantom) -> list[FileDataset]:
    """One CT Image Storage dataset per slice along the phantom's third axis (`dicom_volume.slice_datasets`)."""
    names = dicom_volume.SeriesNames(
        patient_name=f"Phantom^{phantom.spec.name}", patient_id=phantom.spec.name,
        study_description="rocm_zoo synthetic abdominal CT phantom (not a patient)",
        series_description=phantom.spec.name, manufacturer="rocm_zoo synthetic phantom", study_date=_STUDY_DATE,
        extra={"BodyPartExamined": "ABDOMEN", "ImageType": ["DERIVED", "SECONDARY", "AXIAL"]})
    frames = np.asarray(phantom.image, dtype=np.int16).transpose(2, 1, 0)
    return dicom_volume.slice_datasets(frames, dicom_volume.Geometry.from_ras_affine(phantom.affine),
                                       series_uids(phantom), names)


def write_series(phantom: Phantom, folder: Path) -> list[Path]:
    """Writes the series into `folder` (one `.dcm` per slice); returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for ds in slice_datasets(phantom):
        path = folder / f"{ds.InstanceNumber:04d}.dcm"
        atomic_write(path, lambda out, ds=ds: ds.save_as(out, write_like_original=False))
        files.append(path)
    return files


def read_series(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(HU volume indexed (column, row, slice), voxel-to-LPS affine) of a series written by `write_series`, sorted
    along the slice normal. For tests and tools; the server converts with SimpleITK as MONAI Label does."""
    datasets = [pydicom.dcmread(f) for f in files]
    iop = np.asarray(datasets[0].ImageOrientationPatient, dtype=float)
    normal = np.cross(iop[:3], iop[3:])
    datasets.sort(key=lambda d: float(np.dot(normal, np.asarray(d.ImagePositionPatient, dtype=float))))
    volume = np.stack([d.pixel_array.T * float(d.RescaleSlope) + float(d.RescaleIntercept) for d in datasets], -1)
    first, last = (np.asarray(d.ImagePositionPatient, dtype=float) for d in (datasets[0], datasets[-1]))
    row_spacing, col_spacing = (float(v) for v in datasets[0].PixelSpacing)
    affine = np.eye(4)
    affine[:3, 0] = iop[:3] * col_spacing
    affine[:3, 1] = iop[3:] * row_spacing
    affine[:3, 2] = (last - first) / max(len(datasets) - 1, 1)
    affine[:3, 3] = first
    return volume, affine
