"""A CT volume as a DICOM series: one CT Image Storage instance per slice along its third axis, in LPS patient
coordinates, signed 16-bit values (HU). Shared by the sample phantoms written for a PACS (`samples.dicom_series`) and
the local datastore's volumes served to OHIF (`dicomweb.local_series`).

UIDs are derived from a key (for a datastore volume, its image id), so the same volume gives the same study, series
and instances every time: a PACS loaded twice replaces instead of duplicating, and a viewer's series UID still names
the same image after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def series_uids(key: str) -> tuple[str, str]:
    """(StudyInstanceUID, SeriesInstanceUID) of the series made under `key`."""
    return generate_uid(entropy_srcs=[key, "study"]), generate_uid(entropy_srcs=[key, "series"])


@lru_cache(maxsize=65536)
def local_series_uids(image_id: str) -> tuple[str, str]:
    """The study and series UIDs under which the server shows a local datastore image to DICOMweb viewers."""
    return series_uids(f"rocm_zoo/local/{image_id}")


@lru_cache(maxsize=65536)
def instance_uid(series_uid: str, index: int) -> str:
    return generate_uid(entropy_srcs=[series_uid, str(index)])


@dataclass(frozen=True)
class Geometry:
    """Voxel (i, j, k) to LPS millimetres: origin + directions @ (spacing * index); `directions` holds the unit
    vectors of the i, j and k axes as its columns."""

    origin: np.ndarray
    directions: np.ndarray
    spacing: np.ndarray

    @classmethod
    def from_ras_affine(cls, affine_ras: np.ndarray) -> Geometry:
        lps = _RAS_TO_LPS @ np.asarray(affine_ras, dtype=float)
        spacing = np.linalg.norm(lps[:3, :3], axis=0)
        return cls(lps[:3, 3].copy(), lps[:3, :3] / spacing, spacing)

    def position(self, k: int) -> np.ndarray:
        return self.origin + self.directions[:, 2] * self.spacing[2] * k


@dataclass(frozen=True)
class SeriesNames:
    """What a viewer's study list shows of a series."""

    patient_name: str
    patient_id: str
    study_description: str
    series_description: str
    manufacturer: str = "rocm_zoo"
    study_date: str = "20260101"
    extra: dict = field(default_factory=dict)  # more attributes, the same on every instance (BodyPartExamined, ...)


def slice_datasets(frames: np.ndarray, geometry: Geometry, key_uids: tuple[str, str], names: SeriesNames,
                   with_pixels: bool = True) -> list[FileDataset]:
    """One dataset per slice of `frames` (k, rows, columns) = the volume's (k, j, i): pixel rows run along the j axis
    and columns along i (DICOM's row-major frame of the (i, j) plane). Without `with_pixels`, the attributes only
    (what WADO-RS metadata gives; the pixels travel as frames)."""
    study_uid, series_uid = key_uids
    frame_uid = generate_uid(entropy_srcs=[study_uid, "frame"])
    row_dir, col_dir = geometry.directions[:, 0], geometry.directions[:, 1]
    datasets = []
    for k in range(frames.shape[0]):
        sop_uid = instance_uid(series_uid, k)
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = sop_uid
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(f"{sop_uid}.dcm", {}, file_meta=meta, preamble=b"\0" * 128)
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, sop_uid
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study_uid, series_uid, frame_uid
        ds.Modality, ds.Manufacturer = "CT", names.manufacturer
        ds.PatientName, ds.PatientID = names.patient_name, names.patient_id
        ds.PatientBirthDate, ds.PatientSex = "", "O"
        ds.StudyDate = ds.SeriesDate = ds.ContentDate = names.study_date
        ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
        ds.AccessionNumber, ds.ReferringPhysicianName = "", ""
        ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "1", 1, k + 1
        ds.StudyDescription, ds.SeriesDescription = names.study_description, names.series_description
        for keyword, value in names.extra.items():
            setattr(ds, keyword, value)
        ds.ImagePositionPatient = [float(v) for v in geometry.position(k)]
        ds.ImageOrientationPatient = [float(v) for v in (*row_dir, *col_dir)]
        ds.PixelSpacing = [float(geometry.spacing[1]), float(geometry.spacing[0])]  # (between rows, between columns)
        ds.SliceThickness = float(geometry.spacing[2])
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = frames.shape[1], frames.shape[2]
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = 0, 1, "HU"
        ds.WindowCenter, ds.WindowWidth = 40, 400
        if with_pixels:
            ds.PixelData = np.ascontiguousarray(frames[k], dtype="<i2").tobytes()
        datasets.append(ds)
    return datasets
