"""Label volumes to and from DICOM SEG (binary, one segment per label value present), with highdicom.

A label volume is mapped onto the source series' own grid (frames in the order of the source instances), so the SEG
references every source frame it covers and reading it back gives exactly the voxels written. Each segment carries its
label name, the task's display colour and the label value (as its tracking id: segment numbers must run 1..N, label
values need not). Also the segments and colours of a model's labels, and a label file read back with its affine.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import highdicom as hd
import numpy as np
import SimpleITK as sitk
from monailabel.datastore.utils.colors import GENERIC_ANATOMY_COLORS
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from rocm_zoo import __version__

_TRACKING_PREFIX = "rocm_zoo label "
# The codes MONAI Label uses for its SEGs (SCT "Anatomical Structure" / "Organ"): OHIF groups segments by them.
_CATEGORY = hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure")
_PROPERTY = hd.sr.CodedConcept("78961009", "SCT", "Organ")
_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


class SegError(ValueError):
    """A label cannot be encoded on (or decoded against) its source series; the message says why."""


@dataclass(frozen=True)
class Segment:
    value: int
    name: str
    rgb: tuple[int, int, int]


def source_grid(source: Sequence[Dataset]) -> tuple[list[Dataset], np.ndarray]:
    """The source instances sorted along the slice normal, and the voxel (column, row, slice) to LPS affine."""
    if not source:
        raise SegError("the source series has no instances")
    iop = np.asarray(source[0].ImageOrientationPatient, dtype=float)
    normal = np.cross(iop[:3], iop[3:])
    ordered = sorted(source, key=lambda d: float(np.dot(normal, np.asarray(d.ImagePositionPatient, dtype=float))))
    first = np.asarray(ordered[0].ImagePositionPatient, dtype=float)
    last = np.asarray(ordered[-1].ImagePositionPatient, dtype=float)
    row_spacing, col_spacing = (float(v) for v in ordered[0].PixelSpacing)
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1] = iop[:3] * col_spacing, iop[3:] * row_spacing
    affine[:3, 2] = (last - first) / (len(ordered) - 1) if len(ordered) > 1 else normal * float(
        getattr(ordered[0], "SliceThickness", 1.0) or 1.0)
    affine[:3, 3] = first
    return ordered, affine


def to_source_frames(label: np.ndarray, label_affine_ras: np.ndarray, source: Sequence[Dataset]) -> tuple[list[Dataset], np.ndarray]:
    """(sorted source instances, frames (slice, row, column)) of a label volume that lies on the source grid in any
    axis order or flip (what a conversion to NIfTI and back does); anything else is an error, never a resampling."""
    ordered, grid = source_grid(source)
    label_lps = _RAS_TO_LPS @ np.asarray(label_affine_ras, dtype=float)
    # voxel of the source grid -> voxel of the label: must be a signed permutation plus an integer offset
    to_label = np.linalg.inv(label_lps) @ grid
    perm = np.rint(to_label[:3, :3])
    offset = np.rint(to_label[:3, 3])
    if not (np.allclose(to_label[:3, :3], perm, atol=1e-3) and np.allclose(to_label[:3, 3], offset, atol=1e-2)
            and sorted(np.abs(perm).sum(0)) == [1, 1, 1] and sorted(np.abs(perm).sum(1)) == [1, 1, 1]):
        raise SegError("the label does not lie on the source series' voxel grid (different geometry)")
    shape = (int(ordered[0].Columns), int(ordered[0].Rows), len(ordered))
    axes = [int(np.flatnonzero(perm[:, i])[0]) for i in range(3)]  # label axis for each source axis
    vol = np.transpose(np.asarray(label), axes)
    for i, ax in enumerate(axes):
        if perm[ax, i] < 0:
            vol = np.flip(vol, i)
            start = int(offset[ax]) - (shape[i] - 1)
        else:
            start = int(offset[ax])
        if start != 0 or vol.shape[i] != shape[i]:
            raise SegError(f"the label's shape {np.shape(label)} does not cover the source series {shape}")
    return ordered, np.ascontiguousarray(vol.transpose(2, 1, 0))


def _cielab(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """sRGB 0..255 -> DICOM's CIELab encoding (0..65535 per component, D65)."""
    c = np.asarray(rgb, dtype=float) / 255.0
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    lab = (116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2]))
    return (int(round(lab[0] * 65535 / 100)), int(round((lab[1] + 128) * 65535 / 255)),
            int(round((lab[2] + 128) * 65535 / 255)))


def encode(label: np.ndarray, label_affine_ras: np.ndarray, source: Sequence[Dataset], segments: dict[int, Segment],
           algorithm: str, series_description: str = "") -> Dataset:
    """A binary DICOM SEG of every nonzero label value present; `segments` names and colours them (values it lacks
    get "label N" in grey). An all-background label is an error: a SEG needs at least one segment."""
    ordered, frames = to_source_frames(label, label_affine_ras, source)
    values = [int(v) for v in np.unique(frames) if v != 0]
    if not values:
        raise SegError("the label is empty (background only): there is no segment to store")
    algorithm_id = hd.AlgorithmIdentificationSequence(name=algorithm, version=__version__,
                                                      family=codes.cid7162.ArtificialIntelligence)
    descriptions = []
    for number, value in enumerate(values, start=1):
        seg = segments.get(value) or Segment(value, f"label {value}", (128, 128, 128))
        desc = hd.seg.SegmentDescription(
            segment_number=number, segment_label=seg.name[:64],
            segmented_property_category=_CATEGORY,
            segmented_property_type=_PROPERTY,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm_identification=algorithm_id,
            tracking_id=f"{_TRACKING_PREFIX}{value}", tracking_uid=generate_uid())
        desc.RecommendedDisplayCIELabValue = list(_cielab(seg.rgb))
        descriptions.append(desc)
    # A label map of segment numbers 1..N (highdicom's 3D integer form), not one boolean volume per label: a
    # whole-body label of 104 values on 512x512x55 would be 1.5 GB of masks (10.8 GB on 512x512x397).
    numbers = np.zeros(max(values) + 1, dtype=np.uint8 if len(values) < 256 else np.uint16)
    numbers[values] = np.arange(1, len(values) + 1)
    return hd.seg.Segmentation(
        source_images=ordered, pixel_array=numbers[frames], segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=descriptions, series_instance_uid=generate_uid(), series_number=300,
        sop_instance_uid=generate_uid(), instance_number=1, manufacturer="rocm_zoo",
        manufacturer_model_name=algorithm[:64], software_versions=__version__, device_serial_number="none",
        series_description=(series_description or f"{algorithm} segmentation")[:64],
        content_label="SEGMENTATION", content_description=f"rocm_zoo {algorithm}"[:64],
        content_creator_name="rocm_zoo^", omit_empty_frames=True)


def segment_values(seg: Dataset) -> dict[int, int]:
    """segment number -> label value (from the tracking id; a SEG not written here maps number to itself)."""
    out = {}
    for item in seg.SegmentSequence:
        tracking = str(getattr(item, "TrackingID", ""))
        number = int(item.SegmentNumber)
        out[number] = int(tracking[len(_TRACKING_PREFIX):]) if tracking.startswith(_TRACKING_PREFIX) else number
    return out


def decode(seg: Dataset, source: Sequence[Dataset]) -> np.ndarray:
    """The label volume of a SEG on its source series' grid, indexed (column, row, slice) like `source_grid`."""
    ordered, _ = source_grid(source)
    reader = hd.seg.Segmentation.from_dataset(seg)
    numbers = reader.get_segment_numbers()
    uids = [str(d.SOPInstanceUID) for d in ordered]
    referenced = {str(u[2]) for u in reader.get_source_image_uids()}
    present = [u for u in uids if u in referenced]
    frames = np.zeros((len(uids), int(ordered[0].Rows), int(ordered[0].Columns)), dtype=np.int32)
    if present:
        masks = reader.get_pixels_by_source_instance(present, segment_numbers=numbers,
                                                     assert_missing_frames_are_empty=True)
        values = segment_values(seg)
        for i, uid in enumerate(present):
            slot = uids.index(uid)
            for j, number in enumerate(numbers):
                frames[slot][masks[i, ..., j] > 0] = values[number]
    return frames.transpose(2, 1, 0)


def label_colour(name: str) -> tuple[int, int, int]:
    """MONAI Label's anatomy colour for the name (what its viewers use), else a stable colour from the name."""
    rgb = GENERIC_ANATOMY_COLORS.get(name) or GENERIC_ANATOMY_COLORS.get(name.replace("_", " "))
    if rgb:
        return tuple(int(c) for c in rgb[:3])
    h = zlib.crc32(name.encode())
    return (64 + h % 192, 64 + (h >> 8) % 192, 64 + (h >> 16) % 192)


def segments_for(labels: Mapping[str, int]) -> dict[int, Segment]:
    return {int(v): Segment(int(v), str(k), label_colour(str(k))) for k, v in labels.items() if int(v)}


def read_label(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(array indexed like ITK (x, y, z), voxel-to-RAS affine) of a label file in any format ITK reads."""
    image = sitk.ReadImage(path)
    array = sitk.GetArrayFromImage(image).transpose(2, 1, 0)
    direction = np.asarray(image.GetDirection(), dtype=float).reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = direction * np.asarray(image.GetSpacing(), dtype=float)
    lps[:3, 3] = image.GetOrigin()
    return array, np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps
