"""MONAI Label's DICOMweb datastore, storing labels back to the PACS as DICOM SEG written with highdicom.

MONAI Label's own store shells out to dcmqi's `itkimage2segimage` (downloaded from GitHub at start-up) and only for
the `final` tag. Here every label a model produces (`original`, from `save_label` requests and batches) and every
`final` one goes to the PACS as a binary SEG whose segments carry the task's label names and colours; no external
tool, nothing downloaded.

Reading images is MONAI Label's (WADO-RS download, SimpleITK conversion), with three changes: a series is converted
once and reused while its instance list in the PACS is unchanged, within a byte budget (`SeriesCache`), so clicks
do not fetch and convert it again; a series that is not a CT volume is refused from its headers before conversion;
a PACS that is down or a series deleted mid-session is a clear error (503 after retries / 404), never a stale image.

Every call to the PACS has a connect and a read timeout, never past the deadline of the request it serves
(`pacs_http`): a PACS that hangs is a 504 with the reason, and the thread, the request's slot and the conversion lock
are free again. What the PACS lists (`/info/`, `/datastore/`, active learning) is the last listing, refreshed in the
background (`pacs_listing`), so those routes answer at once whatever the PACS does.

Each stage a request spends here (fetch series, convert, encode SEG, store) is timed into `request_stages`.

No label is lost: a label is checked (readable, integer, the series' grid) and saved in the local cache first
(atomically); if it cannot be stored as SEG (a series that DICOM SEG cannot describe, e.g. without a Frame of Reference
UID) or the PACS does not take it, a copy is kept in the pending folder next to the cache (`<cache>/pending-seg/`)
and the request gets a 4xx (503 for a PACS that is down) with the reason. `rocm-zoo pacs push` stores the pending
labels once the cause is fixed (`push_pending`).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil
import threading
import time
from typing import Any, Callable, Dict, Mapping

import pydicom
import requests
from monailabel.config import settings
from monailabel.datastore.dicom import DICOMwebClientX, DICOMWebDatastore
from monailabel.datastore.local import LocalDatastore
from monailabel.datastore.utils.convert import binary_to_image, dicom_to_nifti
from monailabel.datastore.utils.dicom import dicom_web_download_series
from monailabel.interfaces.datastore import DefaultLabelTag

from rocm_zoo.dicomweb import dicom_seg
from rocm_zoo.dicomweb.dicom_seg import label_colour, read_label, segments_for
from rocm_zoo.dicomweb.pacs_http import PacsTimeouts, bound_session
from rocm_zoo.dicomweb.pacs_listing import PacsListing
from rocm_zoo.dicomweb.series_cache import SeriesCache, series_signature
from rocm_zoo.dicomweb.series_check import check_series
from rocm_zoo.engine.atomic_files import atomic_copy, atomic_write_text
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.errors import ImageNotFound, InvalidRequest, PacsTimeout, PacsUnavailable
from rocm_zoo.server.http import request_stages
from rocm_zoo.server.http.access import check_name
from rocm_zoo.server.store.datastore import AtomicLocalDatastore
from rocm_zoo.server.store.uploads import check_label

logger = logging.getLogger(__name__)

SEG_TAGS = (DefaultLabelTag.ORIGINAL.value, DefaultLabelTag.FINAL.value)
PACS_ATTEMPTS = 3  # a PACS restarting answers within a second or two
PACS_RETRY_S = 0.5
LabelsOf = Callable[[str], Mapping[str, int]]  # model name -> {label name: label value}
PENDING_DIR = "pending-seg"
_UID = re.compile(r"^[0-9][0-9.]{0,63}$")


class SegNotStored(InvalidRequest):
    """The label was kept locally (pending) but cannot be stored in the PACS as DICOM SEG; the reason says why."""


class PacsDownLabelKept(PacsUnavailable):
    """The PACS did not take the SEG; the label is kept locally (pending) for `rocm-zoo pacs push`."""


class SegDicomWebDatastore(AtomicLocalDatastore, DICOMWebDatastore):
    def __init__(self, client, labels_of: LabelsOf, cache_path: str | None = None, search_filter: Dict | None = None,
                 max_cache_bytes: int = 8 << 30):
        super().__init__(client=client, search_filter=search_filter or settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER,
                         cache_path=cache_path, fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME,
                         convert_to_nifti=True)
        self._labels_of = labels_of
        self.series_cache = SeriesCache(max_cache_bytes, self._remove_local)
        self._convert_lock = threading.Lock()
        ttl = float(settings.MONAI_LABEL_DICOMWEB_CACHE_EXPIRY)  # MONAI Label's own listing cache lifetime
        self._series_listing = PacsListing("series", lambda: DICOMWebDatastore.list_images.__wrapped__(self), ttl)
        self._labeled_listing = PacsListing(
            "labelled series", lambda: DICOMWebDatastore.get_labeled_images.__wrapped__(self), ttl)

    def list_images(self) -> list[str]:
        return list(self._series_listing.get())

    def get_labeled_images(self, label_tag: str | None = None, labels: list[str] | None = None) -> list[str]:
        return list(self._labeled_listing.get())  # MONAI Label's DICOMweb listing ignores both arguments too

    def status(self) -> Dict[str, Any]:
        """MONAI Label's counts, from the last listings, and how the PACS answered lately; a PACS never listed (down
        since start-up) gives zero counts and the reason, not an error: `/info/` must answer for viewers to connect."""
        try:
            out = super().status()
        except (PacsTimeout, PacsUnavailable) as e:
            out = {"total": 0, "completed": 0, "label_tags": {}, "error": first_line(e)}
        out["pacs"] = {"series": self._series_listing.info(), "labelled": self._labeled_listing.info()}
        return out

    def start_listing(self) -> None:
        """Asks the PACS for its listings now, in the background, so the first `/info/` need not wait for them."""
        self._series_listing.start()
        self._labeled_listing.start()

    def series_dir(self, image_id: str) -> str:
        return os.path.realpath(os.path.join(self._datastore.image_path(), image_id))

    def nifti_path(self, image_id: str) -> str:
        return os.path.realpath(os.path.join(self._datastore.image_path(), f"{image_id}.nii.gz"))

    def get_image_uri(self, image_id: str) -> str:
        if not isinstance(image_id, str) or not _UID.match(image_id):  # never a query the PACS would refuse
            raise ImageNotFound(f"Series '{str(image_id)[:80]}' is not in the PACS (not a DICOM UID)")
        with request_stages.timed("fetch_series"):  # a cached series costs its look-up here, nothing else
            signature = self.series_signature(image_id)
        nifti = self.nifti_path(image_id)
        with self._convert_lock:  # concurrent clicks on a new series wait for one conversion
            if self.series_cache.lookup(image_id, signature) and os.path.exists(nifti):
                return nifti
            self._remove_local(image_id)  # whatever is on disk is of an unknown or older version
            start = time.perf_counter()
            folder = self.series_dir(image_id)
            with request_stages.timed("fetch_series"):
                self._pacs_call(f"download series {image_id}", lambda: dicom_web_download_series(
                    None, image_id, folder, self._client, self._fetch_by_frame), image_id)
            fetched = time.perf_counter()
            try:
                with request_stages.timed("convert"):
                    files = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".dcm")]
                    check_series(image_id, [pydicom.dcmread(f, stop_before_pixels=True) for f in files])
                    converted = dicom_to_nifti(folder)
                    try:
                        LocalDatastore.add_image(self, image_id, converted, self._dicom_info(image_id))
                    finally:
                        if os.path.exists(converted):
                            os.unlink(converted)
            except Exception:
                self._remove_local(image_id)
                raise
            done = time.perf_counter()
            nbytes = os.path.getsize(nifti) + sum(os.path.getsize(f) for f in files)
            self.series_cache.add(image_id, signature, nbytes)
            logger.info("series %s fetched in %.2f s, converted in %.2f s (%.1f MB)", image_id, fetched - start,
                        done - fetched, nbytes / 1e6)
            return nifti

    def series_signature(self, image_id: str) -> str:
        """The series' version in the PACS (one QIDO request); ImageNotFound when the PACS no longer has it."""
        found = self._pacs_call(f"look up series {image_id}", lambda: self._client.search_for_instances(
            search_filters={"SeriesInstanceUID": image_id}, fields=["SOPInstanceUID"], get_remaining=True), image_id)
        uids = [d["00080018"]["Value"][0] for d in found if d.get("00080018", {}).get("Value")]
        if not uids:
            self.series_cache.forget(image_id)
            raise ImageNotFound(f"Series {image_id} is not in the PACS at {self._client.base_url} (deleted?)")
        return series_signature(uids)

    def _pacs_call(self, what: str, call: Callable[[], Any], image_id: str) -> Any:
        last: Exception | None = None
        for attempt in range(PACS_ATTEMPTS):
            try:
                return call()
            except PacsTimeout:  # a PACS that hangs: asking again would only hold the request longer
                raise
            except (requests.ConnectionError, requests.Timeout) as e:
                last = e
            except requests.HTTPError as e:
                status = e.response.status_code if e.response is not None else 0
                if status == 404:
                    self.series_cache.forget(image_id)
                    raise ImageNotFound(f"Series {image_id} is not in the PACS at {self._client.base_url} "
                                        f"(deleted?)") from e
                if status < 500:
                    raise PacsUnavailable(f"The PACS at {self._client.base_url} refused to {what}: "
                                          f"{first_line(e)}") from e
                last = e
            except IndexError as e:  # MONAI Label's download looks the study up first: gone between two requests
                self.series_cache.forget(image_id)
                raise ImageNotFound(f"Series {image_id} is not in the PACS at {self._client.base_url} "
                                    f"(deleted?)") from e
            time.sleep(PACS_RETRY_S * (attempt + 1))
        reason = getattr(last, "reason", None) or first_line(last)
        raise PacsUnavailable(f"The PACS at {self._client.base_url} does not answer ({what}: {reason}); "
                              f"tried {PACS_ATTEMPTS} times. Retry once it is back.")

    def _remove_local(self, image_id: str) -> None:
        shutil.rmtree(self.series_dir(image_id), ignore_errors=True)
        if image_id in self._datastore.objects:
            LocalDatastore.remove_image(self, image_id)
        elif os.path.exists(self.nifti_path(image_id)):
            os.unlink(self.nifti_path(image_id))

    @property
    def pending_dir(self) -> pathlib.Path:
        return pathlib.Path(self._datastore_path) / PENDING_DIR

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: Dict[str, Any],
                   label_id: str = "") -> str:
        """Checked, kept locally (atomically), then stored in the PACS as SEG; a SEG that cannot be made or stored
        leaves the label in the pending folder and raises SegNotStored (422) or PacsDownLabelKept (503)."""
        check_name(label_tag, "label tag")
        image_uri = self.get_image_uri(image_id)  # the source series is on disk from here on
        converted = ""
        if "".join(pathlib.Path(label_filename).suffixes) == ".bin":
            converted = label_filename = binary_to_image(image_uri, label_filename)
        label_info = dict(label_info or {})
        try:
            check_label(label_filename, image_uri)
            saved = self._save_label_atomic(image_id, label_filename, label_tag, label_info)
            if label_tag in SEG_TAGS and not read_label(label_filename)[0].any():
                logger.info("label of %s (tag %s) is all background: kept locally only (a SEG needs a segment)",
                            image_id, label_tag)
            elif label_tag in SEG_TAGS:
                segments = self.segments_of(label_info)
                try:
                    stored = self.store_seg(image_id, label_filename, label_info, segments)
                except (dicom_seg.SegError, ValueError, AttributeError, KeyError, TypeError, IndexError) as e:
                    self.keep_pending(image_id, label_filename, label_tag, label_info, segments, first_line(e))
                    raise SegNotStored(f"The label of series {image_id} was kept on the server (pending) but cannot "
                                       f"be stored in the PACS as DICOM SEG: {first_line(e)}. Fix the series, then "
                                       "run `rocm-zoo pacs push`.") from e
                except (requests.RequestException, PacsUnavailable) as e:
                    self.keep_pending(image_id, label_filename, label_tag, label_info, segments, first_line(e))
                    raise PacsDownLabelKept(f"The PACS did not store the label of series {image_id} "
                                            f"({first_line(e)}); it was kept on the server (pending). Run "
                                            "`rocm-zoo pacs push` once the PACS is back.") from e
                self._forget_pending(image_id, label_tag)  # a newer label made it: an older pending one is stale
                self._labeled_listing.invalidate()
                obj = self._datastore.objects.get(image_id)
                if obj is not None and label_tag in obj.labels:
                    obj.labels[label_tag].info.update(stored)
                    self._update_datastore_file()
            return saved
        finally:
            if converted and os.path.exists(converted):
                os.unlink(converted)

    def segments_of(self, label_info: Dict[str, Any]) -> dict[int, dicom_seg.Segment]:
        model = str(label_info.get("model") or "")
        segments = segments_for(self._labels_of(model) if model else {})
        for item in label_info.get("label_info") or []:  # names a viewer sent with a `final` label
            if isinstance(item, dict) and item.get("name") and item.get("idx") is not None:
                rgb = tuple(item.get("color") or label_colour(item["name"]))[:3]
                segments[int(item["idx"])] = dicom_seg.Segment(int(item["idx"]), str(item["name"]), rgb)
        return segments

    def store_seg(self, image_id: str, label_filename: str, label_info: Dict[str, Any],
                  segments: dict[int, dicom_seg.Segment] | None = None) -> Dict[str, Any]:
        """Encodes the label as DICOM SEG against its series and stores it in the PACS; returns what to remember."""
        model = str(label_info.get("model") or "")
        segments = self.segments_of(label_info) if segments is None else segments
        folder = self.series_dir(image_id)
        with request_stages.timed("encode_seg"):
            source = [pydicom.dcmread(os.path.join(folder, f), stop_before_pixels=True)
                      for f in sorted(os.listdir(folder)) if f.endswith(".dcm")]
            label, affine = read_label(label_filename)
            seg = dicom_seg.encode(label, affine, source, segments, algorithm=model or "manual",
                                   series_description=f"{model or 'label'} (rocm_zoo)")
        with request_stages.timed("store"):
            self._client.store_instances([seg])
        logger.info("label of %s stored in the PACS as SEG series %s (%d segments)", image_id,
                    seg.SeriesInstanceUID, len(seg.SegmentSequence))
        return {"SeriesInstanceUID": str(seg.SeriesInstanceUID), "StudyInstanceUID": str(seg.StudyInstanceUID),
                "segments": [str(s.SegmentLabel) for s in seg.SegmentSequence]}

    # --- labels the PACS did not take -------------------------------------------------------------------------------

    def keep_pending(self, image_id: str, label_filename: str, tag: str, label_info: Dict[str, Any],
                     segments: dict[int, dicom_seg.Segment], reason: str) -> pathlib.Path:
        """The label and what its SEG needs, in pending-seg/<series>/<tag>/ (label first, meta.json last: an entry
        without meta.json is incomplete and ignored). One entry per series and tag: the newest label counts."""
        entry = self.pending_dir / image_id / tag
        entry.mkdir(parents=True, exist_ok=True)
        ext = "".join(pathlib.Path(label_filename).suffixes) or ".nii.gz"
        for old in entry.glob("label.*"):
            if old.name != f"label{ext}":
                old.unlink()
        atomic_copy(label_filename, str(entry / f"label{ext}"))
        meta = {"image_id": image_id, "tag": tag, "label": f"label{ext}", "reason": reason, "ts": time.time(),
                "label_info": json.loads(json.dumps(label_info, default=str)),
                "segments": [[s.value, s.name, list(s.rgb)] for s in segments.values()]}
        atomic_write_text(str(entry / "meta.json"), json.dumps(meta, indent=2))
        logger.warning("label of %s (tag %s) kept pending for the PACS: %s", image_id, tag, reason)
        return entry

    def _forget_pending(self, image_id: str, tag: str) -> None:
        entry = self.pending_dir / image_id / tag
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)

    def pending(self, folder: pathlib.Path | None = None) -> list[dict]:
        """The complete entries of a pending folder (default this store's)."""
        out = []
        for meta_file in sorted(pathlib.Path(folder or self.pending_dir).glob("*/*/meta.json")):
            try:
                meta = json.loads(meta_file.read_text())
            except (OSError, ValueError):
                continue
            meta["entry"] = str(meta_file.parent)
            out.append(meta)
        return out

    def push_pending(self, folder: pathlib.Path | None = None) -> list[dict]:
        """Stores every label of a pending folder (default this store's; `rocm-zoo pacs push` passes the server's,
        with a store of its own cache) in the PACS as SEG, the series fetched afresh; returns one result per label:
        image_id, tag, ok, reason (and the SEG series when stored). A label that fails again stays pending."""
        results = []
        for meta in self.pending(folder):
            entry = pathlib.Path(meta["entry"])
            image_id, tag = meta["image_id"], meta["tag"]
            segments = {int(v): dicom_seg.Segment(int(v), str(n), tuple(rgb)) for v, n, rgb in meta["segments"]}
            try:
                self.series_cache.forget(image_id)  # the series may have been fixed in the PACS meanwhile
                self.get_image_uri(image_id)
                stored = self.store_seg(image_id, str(entry / meta["label"]), meta.get("label_info") or {}, segments)
            except Exception as e:
                results.append({"image_id": image_id, "tag": tag, "ok": False, "reason": first_line(e)})
                continue
            shutil.rmtree(entry, ignore_errors=True)
            results.append({"image_id": image_id, "tag": tag, "ok": True, "reason": "",
                            "SeriesInstanceUID": stored["SeriesInstanceUID"]})
        return results


def pending_folder(url: str, cache_path: str | None = None) -> pathlib.Path:
    """Where the server started with `--studies url` keeps labels the PACS did not take (the same cache rules as
    MONAI Label: MONAI_LABEL_DICOMWEB_CACHE_PATH or ~/.cache/monailabel/dicom, one folder per PACS URL)."""
    from monailabel.utils.others.generic import md5_digest

    cache = cache_path or (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or "").strip()
    base = pathlib.Path(cache) if cache else pathlib.Path.home() / ".cache" / "monailabel" / "dicom"
    return base / md5_digest(url.rstrip("/")) / PENDING_DIR


def push(url: str, cache_path: str | None = None) -> list[dict]:
    """`rocm-zoo pacs push`: the pending labels of the server for `url`, stored in the PACS now. The series are
    fetched into a temporary cache of this process, so a running server's cache is left alone."""
    import tempfile

    folder = pending_folder(url, cache_path)
    # A leftover temporary folder is harmless; a push that stored its labels and then failed on it would not be.
    with tempfile.TemporaryDirectory(prefix="rocm_zoo-push-", ignore_cleanup_errors=True) as tmp:
        store = _open(url, lambda model: {}, tmp, 1 << 30)
        try:
            return store.push_pending(folder)
        finally:
            # MONAI Label's datastore watches its folder and rewrites its index on every change, from the watcher's
            # thread: stopped and joined, it no longer writes into the folder while it is removed.
            observer = getattr(store, "_observer", None)
            if observer is not None:
                observer.stop()
                observer.join(timeout=10)


def from_url(url: str, labels_of: LabelsOf, cache_gb: float = 8.0,
             timeouts: PacsTimeouts = PacsTimeouts()) -> SegDicomWebDatastore:
    """The datastore for `--studies http(s)://.../dicom-web` (MONAI Label's prefixes, user and cache settings)."""
    cache = (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or "").strip() or None
    store = _open(url, labels_of, cache, int(cache_gb * (1 << 30)), timeouts)
    store.start_listing()
    return store


def _open(url: str, labels_of: LabelsOf, cache: str | None, max_bytes: int,
          timeouts: PacsTimeouts = PacsTimeouts()) -> SegDicomWebDatastore:
    from dicomweb_client.session_utils import create_session_from_user_pass

    session = requests.Session()
    if settings.MONAI_LABEL_DICOMWEB_USERNAME and settings.MONAI_LABEL_DICOMWEB_PASSWORD:
        session = create_session_from_user_pass(settings.MONAI_LABEL_DICOMWEB_USERNAME,
                                                settings.MONAI_LABEL_DICOMWEB_PASSWORD)
    session = bound_session(session, url.rstrip("/"), timeouts)
    client = DICOMwebClientX(url=url.rstrip("/"), session=session, qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
                             wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
                             stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX)
    # dicomweb_client retries every exception 5 times with exponential waits (30 s for a PACS that is down); the
    # store retries itself, briefly, and then says so.
    client.set_http_retry_params(retry=False)
    return SegDicomWebDatastore(client, labels_of, cache_path=cache, max_cache_bytes=max_bytes)
