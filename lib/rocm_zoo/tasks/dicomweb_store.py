"""MONAI Label's DICOMweb datastore, storing labels back to the PACS as DICOM SEG written with highdicom.

MONAI Label's own store shells out to dcmqi's `itkimage2segimage` (downloaded from GitHub at start-up) and only for
the `final` tag. Here every label a model produces (`original`, from `save_label` requests and batches) and every
`final` one goes to the PACS as a binary SEG whose segments carry the task's label names and colours; no external
tool, nothing downloaded. Reading images (QIDO/WADO, SimpleITK conversion) is MONAI Label's.
"""

from __future__ import annotations

import logging
import os
import pathlib
import zlib
from typing import Any, Callable, Dict, Mapping

import numpy as np
import pydicom
import SimpleITK as sitk
from monailabel.config import settings
from monailabel.datastore.dicom import DICOMwebClientX, DICOMWebDatastore
from monailabel.datastore.local import LocalDatastore
from monailabel.datastore.utils.colors import GENERIC_ANATOMY_COLORS
from monailabel.datastore.utils.convert import binary_to_image
from monailabel.interfaces.datastore import DefaultLabelTag

from rocm_zoo import dicom_seg

logger = logging.getLogger(__name__)

SEG_TAGS = (DefaultLabelTag.ORIGINAL.value, DefaultLabelTag.FINAL.value)
LabelsOf = Callable[[str], Mapping[str, int]]  # model name -> {label name: label value}


def label_colour(name: str) -> tuple[int, int, int]:
    """MONAI Label's anatomy colour for the name (what its viewers use), else a stable colour from the name."""
    rgb = GENERIC_ANATOMY_COLORS.get(name) or GENERIC_ANATOMY_COLORS.get(name.replace("_", " "))
    if rgb:
        return tuple(int(c) for c in rgb[:3])
    h = zlib.crc32(name.encode())
    return (64 + h % 192, 64 + (h >> 8) % 192, 64 + (h >> 16) % 192)


def segments_for(labels: Mapping[str, int]) -> dict[int, dicom_seg.Segment]:
    return {int(v): dicom_seg.Segment(int(v), str(k), label_colour(str(k))) for k, v in labels.items() if int(v)}


def read_label(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(array indexed like ITK (x, y, z), voxel-to-RAS affine) of a label file in any format ITK reads."""
    image = sitk.ReadImage(path)
    array = sitk.GetArrayFromImage(image).transpose(2, 1, 0)
    direction = np.asarray(image.GetDirection(), dtype=float).reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = direction * np.asarray(image.GetSpacing(), dtype=float)
    lps[:3, 3] = image.GetOrigin()
    return array, np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


class SegDicomWebDatastore(DICOMWebDatastore):
    def __init__(self, client, labels_of: LabelsOf, cache_path: str | None = None, search_filter: Dict | None = None):
        super().__init__(client=client, search_filter=search_filter or settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER,
                         cache_path=cache_path, fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME,
                         convert_to_nifti=True)
        self._labels_of = labels_of

    def series_dir(self, image_id: str) -> str:
        return os.path.realpath(os.path.join(self._datastore.image_path(), image_id))

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: Dict[str, Any],
                   label_id: str = "") -> str:
        image_uri = self.get_image_uri(image_id)  # the source series is on disk from here on
        converted = ""
        if "".join(pathlib.Path(label_filename).suffixes) == ".bin":
            converted = label_filename = binary_to_image(image_uri, label_filename)
        label_info = dict(label_info or {})
        try:
            if label_tag in SEG_TAGS:
                label_info.update(self.store_seg(image_id, label_filename, label_info))
            return LocalDatastore.save_label(self, image_id, label_filename, label_tag, label_info)
        finally:
            if converted and os.path.exists(converted):
                os.unlink(converted)

    def store_seg(self, image_id: str, label_filename: str, label_info: Dict[str, Any]) -> Dict[str, Any]:
        """Encodes the label as DICOM SEG against its series and stores it in the PACS; returns what to remember."""
        model = str(label_info.get("model") or "")
        segments = segments_for(self._labels_of(model) if model else {})
        for item in label_info.get("label_info") or []:  # names a viewer sent with a `final` label
            if isinstance(item, dict) and item.get("name") and item.get("idx") is not None:
                rgb = tuple(item.get("color") or label_colour(item["name"]))[:3]
                segments[int(item["idx"])] = dicom_seg.Segment(int(item["idx"]), str(item["name"]), rgb)
        folder = self.series_dir(image_id)
        source = [pydicom.dcmread(os.path.join(folder, f), stop_before_pixels=True)
                  for f in sorted(os.listdir(folder)) if f.endswith(".dcm")]
        label, affine = read_label(label_filename)
        seg = dicom_seg.encode(label, affine, source, segments, algorithm=model or "manual",
                               series_description=f"{model or 'label'} (rocm_zoo)")
        self._client.store_instances([seg])
        logger.info("label of %s stored in the PACS as SEG series %s (%d segments)", image_id,
                    seg.SeriesInstanceUID, len(seg.SegmentSequence))
        return {"SeriesInstanceUID": str(seg.SeriesInstanceUID), "StudyInstanceUID": str(seg.StudyInstanceUID),
                "segments": [str(s.SegmentLabel) for s in seg.SegmentSequence]}


def from_url(url: str, labels_of: LabelsOf) -> SegDicomWebDatastore:
    """The datastore for `--studies http(s)://.../dicom-web` (MONAI Label's prefixes, user and cache settings)."""
    from dicomweb_client.session_utils import create_session_from_user_pass

    session = None
    if settings.MONAI_LABEL_DICOMWEB_USERNAME and settings.MONAI_LABEL_DICOMWEB_PASSWORD:
        session = create_session_from_user_pass(settings.MONAI_LABEL_DICOMWEB_USERNAME,
                                                settings.MONAI_LABEL_DICOMWEB_PASSWORD)
    client = DICOMwebClientX(url=url.rstrip("/"), session=session, qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
                             wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
                             stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX)
    cache = (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or "").strip() or None
    return SegDicomWebDatastore(client, labels_of, cache_path=cache)
