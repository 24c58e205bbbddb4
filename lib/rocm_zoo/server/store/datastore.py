"""MONAI Label's local datastore, refusing uploads that are not readable volumes and never losing or tearing a label.

Every file the datastore writes (an uploaded image, a label, its index `datastore_v2.json`) is written to a temporary
file next to its place, flushed to disk and renamed over it, and the index is updated last: a reader, a crash or a
`kill -9` sees the old file or the new one, never half of one. A label file written before a crash but not yet in the
index is picked up by MONAI Label's reconciliation at the next start; temporary files older than the process are
removed then, and an index that cannot be read (written by an older, non-atomic server) is set aside and rebuilt from the files.

Images and labels are checked before they are stored, header first (`volume_check.check_volume`,
`uploads.check_label`: within the volume budget, complete, a label of finite whole numbers on its image's grid), and
ids and tags must be plain names (they become file names). An image id already in the datastore is not replaced
(409): its labels were drawn on those pixels. An image may also be named by the series UID under which DICOMweb
viewers see it (`dicom_volume.local_series_uids`; OHIF names that in `/infer` and `/datastore/label`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

from filelock import FileLock
from monailabel.config import settings
from monailabel.datastore.local import DataModel, ImageLabelModel, LocalDatastore
from monailabel.interfaces.exception import ImageNotFoundException

from rocm_zoo.dicom_volume import local_series_uids
from rocm_zoo.engine.atomic_files import PARTIAL, atomic_copy, atomic_write_text
from rocm_zoo.engine.volume_check import check_volume
from rocm_zoo.errors import AlreadyExists, InvalidRequest
from rocm_zoo.server.http.access import check_name
from rocm_zoo.server.store.uploads import check_label

logger = logging.getLogger(__name__)

# A temporary file older than this process was left by a save that did not finish; a newer one is a save in progress
# (MONAI Label reconciles the datastore again on every file event, while this process may be writing).
_STARTED = time.time()
_SERIES_UID = re.compile(r"^[0-9][0-9.]{8,63}$")


class AtomicLocalDatastore:
    """Mixin over MONAI Label's LocalDatastore (or a subclass of it): atomic index, images and labels; recovery from
    a crash at start."""

    def _init_from_datastore_file(self, throw_exception=False):
        try:
            return super()._init_from_datastore_file(throw_exception=True)
        except ValueError as e:  # torn or corrupt index: the files are the truth, reconciliation rebuilds it
            aside = f"{self._datastore_config_path}.unreadable-{int(time.time())}"
            logger.error("datastore index %s cannot be read (%s); set aside as %s and rebuilt from the files",
                         os.path.basename(self._datastore_config_path), str(e).splitlines()[0][:200],
                         os.path.basename(aside))
            os.replace(self._datastore_config_path, aside)
            self._config_ts = 0

    def _reconcile_datastore(self):
        self._remove_partials()
        return super()._reconcile_datastore()

    def _remove_partials(self) -> None:
        base = Path(self._datastore.image_path())
        folders = [base, Path(self._datastore_path)]
        labels = Path(self._datastore.label_path(None))
        if labels.is_dir():
            folders += [labels] + [p for p in labels.iterdir() if p.is_dir()]
        for folder in dict.fromkeys(folders):
            for leftover in folder.glob(f".*{PARTIAL}*"):
                try:
                    if leftover.stat().st_mtime >= _STARTED:
                        continue
                except FileNotFoundError:  # that save just finished
                    continue
                logger.warning("removing %s, left by a save that did not finish", leftover.name)
                leftover.unlink(missing_ok=True)

    def _update_datastore_file(self, lock=True):
        def write():
            self._ignore_event_config = True
            text = json.dumps(self._datastore.model_dump(exclude={"base_path"}), indent=2, default=str)
            atomic_write_text(self._datastore_config_path, text)
            self._config_ts = os.stat(self._datastore_config_path).st_mtime

        if lock:
            with FileLock(self._lock_file):
                write()
        else:
            write()

    def _save_label_atomic(self, image_id: str, label_filename: str, label_tag: str,
                           label_info: Dict[str, Any]) -> str:
        """MONAI Label's save_label, except that the label file is written atomically and the index after it."""
        obj = self._datastore.objects.get(image_id)
        if not obj:
            raise ImageNotFoundException(f"Image {image_id} not found")
        check_name(label_tag, "label tag")
        _, label_ext = self._to_id(os.path.basename(label_filename))
        label_path = self._datastore.label_path(label_tag)
        name = self._filename(image_id, label_ext)
        with FileLock(self._lock_file):
            atomic_copy(label_filename, os.path.join(label_path, name))
            previous = obj.labels.get(label_tag)
            label_info = dict(label_info or {}, ts=int(time.time()), name=name)
            obj.labels[label_tag] = DataModel(info=label_info, ext=label_ext)
            self._update_datastore_file(lock=False)
            if previous is not None and previous.ext != label_ext:  # the new format replaced the old file's place
                old = os.path.join(label_path, self._filename(image_id, previous.ext))
                if os.path.exists(old):
                    os.remove(old)
        logger.info("label for %s saved under tag '%s' (%s)", image_id, label_tag, name)
        return image_id


class CheckedLocalDatastore(AtomicLocalDatastore, LocalDatastore):
    def known_id(self, image_id: str) -> str:
        """The id itself, or the image a DICOMweb viewer names by its series UID (`dicomweb.local_series`)."""
        if image_id in self._datastore.objects or not _SERIES_UID.match(str(image_id)):
            return image_id
        return next((i for i in list(self._datastore.objects) if local_series_uids(i)[1] == image_id), image_id)

    def get_image_uri(self, image_id: str) -> str:
        return super().get_image_uri(self.known_id(image_id))

    def get_image(self, image_id: str, params=None) -> Any:
        return super().get_image(self.known_id(image_id), params)

    def get_image_info(self, image_id: str) -> Dict[str, Any]:
        return super().get_image_info(self.known_id(image_id))

    def get_label_by_image_id(self, image_id: str, tag: str) -> str:
        return super().get_label_by_image_id(self.known_id(image_id), tag)

    def get_labels_by_image_id(self, image_id: str) -> Dict[str, str]:
        return super().get_labels_by_image_id(self.known_id(image_id))

    def update_image_info(self, image_id: str, info: Dict[str, Any]) -> None:
        return super().update_image_info(self.known_id(image_id), info)

    def add_image(self, image_id: str, image_filename: str, image_info: Dict[str, Any]) -> str:
        """A new image; an id already in the datastore is refused (409): replacing its pixels would leave its labels
        drawn on another image (and a new extension would drop them from the index while their files stay)."""
        derived, image_ext = self._to_id(os.path.basename(image_filename))
        image_id = check_name(image_id or derived, "image id")
        self._refuse_existing(image_id)
        check_volume(image_filename, "image")
        name = self._filename(image_id, image_ext)
        with FileLock(self._lock_file):
            self._refuse_existing(image_id)
            atomic_copy(image_filename, os.path.join(self._datastore.image_path(), name))
            image_info = dict(image_info or {}, ts=int(time.time()), name=name)
            self._datastore.objects[image_id] = ImageLabelModel(image=DataModel(info=image_info, ext=image_ext))
            self._update_datastore_file(lock=False)
        return image_id

    def _refuse_existing(self, image_id: str) -> None:
        if image_id in self._datastore.objects:
            raise AlreadyExists(f"Image '{image_id}' is already in the datastore; to replace it, delete it first "
                                "(DELETE /datastore/image, admins), which removes its labels too")

    def get_dataset_archive(self, limit_cases: Optional[int]) -> str:
        """MONAI Label's zip of the labelled studies (images, labels, metadata.json), in a temporary file that is
        removed again when writing it fails (a full disk); the route that sends it removes it once sent
        (server.store.upload_routes)."""
        studies = self.datalist()
        if not studies:
            raise InvalidRequest("No study has a final label yet: there is no dataset to download")
        if limit_cases and 1 <= limit_cases < len(studies):
            studies = studies[:limit_cases]
        fd, path = tempfile.mkstemp(prefix="dataset-", suffix=".zip")
        try:
            with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, mode="w") as archive:
                for study in studies:
                    for key, file in study.items():
                        archive.write(file, arcname=os.path.join(key, os.path.basename(file)))
                archive.writestr("metadata.json", self._datastore.model_dump_json(exclude={"base_path"}))
        except BaseException:
            os.unlink(path)
            raise
        return path

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: Dict[str, Any]) -> str:
        image_id = self.known_id(image_id)
        if image_id not in self._datastore.objects:
            raise ImageNotFoundException(f"Image {image_id} not found")
        check_label(label_filename, self.get_image_uri(image_id))
        return self._save_label_atomic(image_id, label_filename, label_tag, label_info)


def open_local(folder: Path) -> CheckedLocalDatastore:
    """A studies folder as the server opens it (same file types, labels under labels/<tag>/), without watching it."""
    if not Path(folder).is_dir():
        raise InvalidRequest(f"studies folder {Path(folder).name} does not exist")
    return CheckedLocalDatastore(str(folder), extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT, auto_reload=False)
