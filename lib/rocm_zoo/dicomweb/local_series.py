"""The local datastore's volumes as DICOMweb reads (QIDO-RS search, WADO-RS metadata and frames), so that the OHIF
viewer the server ships works when the studies are a folder of NIfTI or NRRD files and there is no PACS.

Each image is one CT study of one series, one instance per slice along its third axis (`dicom_volume`), with UIDs
derived from the image id (`dicom_volume.local_series_uids`): OHIF names that series UID as the image of `/infer` and
`/datastore/label`, and the datastore takes it for the id (`server.store.datastore`). A volume is converted once, when
a viewer first asks for its metadata or pixels, and kept in the app folder (`cache/dicomweb/`, not in the studies
folder, whose every file event makes MONAI Label re-read the datastore): one `.npy` of 16-bit frames and one JSON of
instance metadata per image, named after the file's size and time so that a changed file is converted again.
Listing studies reads file headers only.

Values that are not whole numbers within 16 bits are rounded and clipped for display only: inference always reads
the datastore's own file.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import SimpleITK as sitk

from rocm_zoo import dicom_volume
from rocm_zoo.engine.atomic_files import atomic_write, atomic_write_text
from rocm_zoo.errors import ImageNotFound, InvalidRequest

logger = logging.getLogger(__name__)

_UID = re.compile(r"^[0-9][0-9.]{0,63}$")
# QIDO-RS attributes a study list can filter on, by tag and keyword (DICOM PS3.18 table 10.6.1-5).
_STUDY_FILTERS = {"00100010": "PatientName", "00100020": "PatientID", "0020000D": "StudyInstanceUID",
                  "00081030": "StudyDescription", "00080061": "ModalitiesInStudy", "00080050": "AccessionNumber",
                  "00080020": "StudyDate"}


def _element(vr: str, *values: Any) -> dict:
    if vr == "PN":
        return {"vr": vr, "Value": [{"Alphabetic": v} for v in values]} if values else {"vr": vr}
    return {"vr": vr, "Value": list(values)} if values else {"vr": vr}


@dataclass(frozen=True)
class LocalImage:
    image_id: str
    path: Path
    study_uid: str
    series_uid: str
    slices: int
    date: str

    def study(self) -> dict:
        return {"00080020": _element("DA", self.date), "00080030": _element("TM", "120000"),
                "00080050": _element("SH"), "00080061": _element("CS", "CT"), "00081030": _element("LO", self.image_id),
                "00100010": _element("PN", self.image_id), "00100020": _element("LO", self.image_id),
                "0020000D": _element("UI", self.study_uid), "00200010": _element("SH", "1"),
                "00201206": _element("IS", 1), "00201208": _element("IS", self.slices)}

    def series(self) -> dict:
        return {"00080060": _element("CS", "CT"), "0008103E": _element("LO", self.image_id),
                "0020000D": _element("UI", self.study_uid), "0020000E": _element("UI", self.series_uid),
                "00200011": _element("IS", 1), "00201209": _element("IS", self.slices)}


class LocalDicomWeb:
    """DICOMweb reads over a datastore: `image_ids()` lists its images, `image_path(id)` gives one's file."""

    def __init__(self, image_ids: Callable[[], list[str]], image_path: Callable[[str], str], cache_dir: Path):
        self._image_ids = image_ids
        self._image_path = image_path
        self.cache_dir = Path(cache_dir)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._described: dict[tuple[str, int, int], LocalImage] = {}

    # --- QIDO-RS ----------------------------------------------------------------------------------------------------

    def search_studies(self, query: Mapping[str, str]) -> list[dict]:
        """Studies matching the query's attribute filters (`*` and `?` wildcards; with fuzzymatching, a name matches
        from the start of any of its words, ignoring case), from `offset`, at most `limit`."""
        fuzzy = str(query.get("fuzzymatching", "")).lower() == "true"
        filters = []
        for key, value in query.items():
            keyword = _STUDY_FILTERS.get(key.upper(), key if key in _STUDY_FILTERS.values() else None)
            if keyword and value:
                filters.append((keyword, str(value)))
        found = [image.study() for image in self._images() if all(_matches(image, k, v, fuzzy) for k, v in filters)]
        offset, limit = _int(query, "offset", 0), _int(query, "limit", 0)
        return found[offset:offset + limit] if limit else found[offset:]

    def search_series(self, study_uid: str) -> list[dict]:
        return [self._by_study(study_uid).series()]

    def search_instances(self, study_uid: str, series_uid: str) -> list[dict]:
        image = self._by_series(study_uid, series_uid)
        return [{"00080016": _element("UI", "1.2.840.10008.5.1.4.1.1.2"),
                 "00080018": _element("UI", dicom_volume.instance_uid(image.series_uid, k)),
                 "0020000D": _element("UI", image.study_uid), "0020000E": _element("UI", image.series_uid),
                 "00200013": _element("IS", k + 1)} for k in range(image.slices)]

    # --- WADO-RS ----------------------------------------------------------------------------------------------------

    def series_metadata(self, study_uid: str, series_uid: str) -> list[dict]:
        return json.loads(self._converted(self._by_series(study_uid, series_uid))[1].read_text())

    def study_metadata(self, study_uid: str) -> list[dict]:
        image = self._by_study(study_uid)
        return self.series_metadata(image.study_uid, image.series_uid)

    def frame(self, study_uid: str, series_uid: str, sop_uid: str, number: int) -> bytes:
        """The pixels of one instance (its only frame, number 1), little-endian signed 16-bit."""
        image = self._by_series(study_uid, series_uid)
        index = next((k for k in range(image.slices) if dicom_volume.instance_uid(image.series_uid, k) == sop_uid),
                     None)
        if index is None or number != 1:
            raise ImageNotFound(f"No instance {sop_uid[:64]} frame {number} in series {series_uid[:64]}")
        frames = np.load(self._converted(image)[0], mmap_mode="r")
        return np.ascontiguousarray(frames[index], dtype="<i2").tobytes()

    # --- the datastore's images ---------------------------------------------------------------------------------------

    def image_id(self, series_uid: str) -> str | None:
        """The datastore id shown under this series UID, if any."""
        if not _UID.match(series_uid):
            return None
        return next((i for i in self._image_ids() if dicom_volume.local_series_uids(i)[1] == series_uid), None)

    def _images(self) -> list[LocalImage]:
        images = []
        for image_id in sorted(self._image_ids()):
            try:
                images.append(self._describe(image_id))
            except (RuntimeError, OSError) as e:  # a file SimpleITK cannot read is not listed (the log says which)
                logger.warning("DICOMweb: %s is not shown to viewers: %s", image_id, str(e).strip().splitlines()[-1])
        return images

    def _describe(self, image_id: str) -> LocalImage:
        path = Path(self._image_path(image_id))
        stat = path.stat()
        key = (image_id, stat.st_size, stat.st_mtime_ns)
        if key not in self._described:  # every frame request names its study: its header is read once
            self._described[key] = self._read_header(image_id, path)
        return self._described[key]

    def _read_header(self, image_id: str, path: Path) -> LocalImage:
        reader = sitk.ImageFileReader()
        reader.SetFileName(str(path))
        reader.ReadImageInformation()
        size = reader.GetSize()
        if len(size) != 3:
            raise RuntimeError(f"a {len(size)}-D image is not a CT volume")
        study_uid, series_uid = dicom_volume.local_series_uids(image_id)
        date = datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y%m%d")
        return LocalImage(image_id, path, study_uid, series_uid, int(size[2]), date)

    def _by_study(self, study_uid: str) -> LocalImage:
        for image_id in self._image_ids():
            if dicom_volume.local_series_uids(image_id)[0] == study_uid:
                return self._describe(image_id)
        raise ImageNotFound(f"No study {study_uid[:64]} in the datastore")

    def _by_series(self, study_uid: str, series_uid: str) -> LocalImage:
        image = self._by_study(study_uid)
        if image.series_uid != series_uid:
            raise ImageNotFound(f"No series {series_uid[:64]} in study {study_uid[:64]}")
        return image

    def _converted(self, image: LocalImage) -> tuple[Path, Path]:
        """(frames .npy, metadata .json) of the image, converted now if not yet (once: concurrent callers wait)."""
        stat = image.path.stat()
        stem = self.cache_dir / f"{image.image_id}-{stat.st_size}-{stat.st_mtime_ns}"
        frames_file, metadata_file = stem.with_suffix(".npy"), stem.with_suffix(".json")
        with self._guard:
            lock = self._locks.setdefault(image.image_id, threading.Lock())
        with lock:
            if not metadata_file.exists():
                self._convert(image, frames_file, metadata_file)
        return frames_file, metadata_file

    def _convert(self, image: LocalImage, frames_file: Path, metadata_file: Path) -> None:
        volume = sitk.ReadImage(str(image.path))
        if volume.GetNumberOfComponentsPerPixel() != 1:
            raise InvalidRequest(f"Image '{image.image_id}' has several values per voxel: not a CT volume")
        frames = sitk.GetArrayViewFromImage(volume)  # (k, j, i)
        if not np.issubdtype(frames.dtype, np.integer) or frames.dtype.itemsize > 2 or frames.dtype == np.uint16:
            frames = np.clip(np.rint(frames), -32768, 32767)
        frames = frames.astype(np.int16)
        directions = np.asarray(volume.GetDirection(), dtype=float).reshape(3, 3)
        geometry = dicom_volume.Geometry(np.asarray(volume.GetOrigin(), dtype=float), directions,
                                         np.asarray(volume.GetSpacing(), dtype=float))
        names = dicom_volume.SeriesNames(patient_name=image.image_id, patient_id=image.image_id,
                                         study_description=image.image_id, series_description=image.image_id,
                                         study_date=image.date)
        datasets = dicom_volume.slice_datasets(frames, geometry, (image.study_uid, image.series_uid), names,
                                               with_pixels=False)
        metadata = [_with_frame_count(ds.to_json_dict()) for ds in datasets]
        atomic_write(frames_file, lambda out: np.save(out, frames))
        atomic_write_text(metadata_file, json.dumps(metadata))  # last: its presence says the conversion is whole
        for stale in self.cache_dir.glob(f"{image.image_id}-*"):
            if stale not in (frames_file, metadata_file) and stale.name.rsplit("-", 2)[0] == image.image_id:
                stale.unlink(missing_ok=True)
        logger.info("DICOMweb: %s converted for viewers (%d slices of %dx%d)", image.image_id, *frames.shape)


def _with_frame_count(instance: dict) -> dict:
    instance["00280008"] = _element("IS", 1)
    return instance


def multipart_frame(pixels: bytes) -> tuple[bytes, str]:
    """(body, content type) of a WADO-RS frames answer: one part of little-endian uncompressed pixels."""
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Type: application/octet-stream; transfer-syntax=1.2.840.10008.1.2.1\r\n\r\n"
            ).encode()
    body = head + pixels + f"\r\n--{boundary}--\r\n".encode()
    return body, f'multipart/related; type="application/octet-stream"; boundary={boundary}'


def _matches(image: LocalImage, keyword: str, wanted: str, fuzzy: bool) -> bool:
    have = {"PatientName": image.image_id, "PatientID": image.image_id, "StudyInstanceUID": image.study_uid,
            "StudyDescription": image.image_id, "ModalitiesInStudy": "CT", "AccessionNumber": "",
            "StudyDate": image.date}[keyword]
    if keyword == "StudyInstanceUID":
        return have in {u.strip() for u in wanted.replace("\\", ",").split(",")}
    if keyword == "StudyDate" and "-" in wanted:
        start, _, end = wanted.partition("-")
        return (not start or have >= start) and (not end or have <= end)
    pattern = re.escape(wanted.strip()).replace(r"\*", ".*").replace(r"\?", ".")
    if fuzzy and keyword == "PatientName":
        return any(re.match(pattern, word, re.I) for word in re.split(r"[\s^_\-.]+", have)) or bool(
            re.match(pattern, have, re.I))
    return re.fullmatch(pattern, have, re.I if fuzzy else 0) is not None


def _int(query: Mapping[str, str], key: str, default: int) -> int:
    try:
        return max(int(query.get(key, default)), 0)
    except ValueError:
        raise InvalidRequest(f"QIDO-RS '{key}' takes a whole number") from None
