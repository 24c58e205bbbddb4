"""A phantom as a CT DICOM series: one file per axial slice, in LPS patient coordinates, HU as signed 16-bit.

UIDs are derived from the phantom's name and seed, so writing the same phantom again gives the same study, series and
instances: loading it into a PACS twice replaces, never duplicates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from rocm_zoo.engine.atomic_files import atomic_write
from rocm_zoo.samples.phantom import Phantom

_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
_STUDY_DATE = "20260101"


def series_uids(phantom: Phantom) -> tuple[str, str]:
    """(StudyInstanceUID, SeriesInstanceUID) of the phantom's series."""
    key = f"rocm_zoo/{phantom.spec.name}/{phantom.spec.seed}"
    return generate_uid(entropy_srcs=[key, "study"]), generate_uid(entropy_srcs=[key, "series"])


def lps_affine(affine_ras: np.ndarray) -> np.ndarray:
    return _RAS_TO_LPS @ np.asarray(affine_ras, dtype=float)


def slice_datasets(phantom: Phantom) -> list[FileDataset]:
    """One CT Image Storage dataset per slice along the phantom's third axis; pixel rows run along its second axis
    and columns along its first (DICOM's row-major frame of the (x, y) plane)."""
    study_uid, series_uid = series_uids(phantom)
    frame_uid = generate_uid(entropy_srcs=[study_uid, "frame"])
    affine = lps_affine(phantom.affine)
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    row_dir, col_dir = affine[:3, 0] / spacing[0], affine[:3, 1] / spacing[1]
    image = np.asarray(phantom.image, dtype=np.int16)
    datasets = []
    for k in range(image.shape[2]):
        sop_uid = generate_uid(entropy_srcs=[series_uid, str(k)])
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = sop_uid
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(f"{sop_uid}.dcm", {}, file_meta=meta, preamble=b"\0" * 128)
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, sop_uid
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study_uid, series_uid, frame_uid
        ds.Modality, ds.Manufacturer = "CT", "rocm_zoo synthetic phantom"
        ds.PatientName, ds.PatientID = f"Phantom^{phantom.spec.name}", phantom.spec.name
        ds.PatientBirthDate, ds.PatientSex = "", "O"
        ds.StudyDate = ds.SeriesDate = ds.ContentDate = _STUDY_DATE
        ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
        ds.AccessionNumber, ds.ReferringPhysicianName = "", ""
        ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "1", 1, k + 1
        ds.StudyDescription = "rocm_zoo synthetic abdominal CT phantom (not a patient)"
        ds.SeriesDescription = phantom.spec.name
        ds.BodyPartExamined = "ABDOMEN"
        ds.ImageType = ["DERIVED", "SECONDARY", "AXIAL"]
        ds.ImagePositionPatient = [float(v) for v in affine[:3, :3] @ [0, 0, k] + affine[:3, 3]]
        ds.ImageOrientationPatient = [float(v) for v in (*row_dir, *col_dir)]
        ds.PixelSpacing = [float(spacing[1]), float(spacing[0])]  # (between rows, between columns)
        ds.SliceThickness = float(spacing[2])
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = image.shape[1], image.shape[0]
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = 0, 1, "HU"
        ds.WindowCenter, ds.WindowWidth = 40, 400
        ds.PixelData = np.ascontiguousarray(image[:, :, k].T).tobytes()
        datasets.append(ds)
    return datasets


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
