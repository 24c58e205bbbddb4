"""MONAI Label's local datastore, refusing uploads that are not readable volumes and writing labels atomically."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

from filelock import FileLock
from monailabel.config import settings
from monailabel.datastore.local import DataModel, LocalDatastore
from monailabel.interfaces.exception import ImageNotFoundException

from rocm_zoo.errors import InvalidRequest
from rocm_zoo.engine.volume_check import check_volume

logger = logging.getLogger(__name__)


class CheckedLocalDatastore(LocalDatastore):
    def add_image(self, image_id: str, image_filename: str, image_info: Dict[str, Any]) -> str:
        check_volume(image_filename, image_info.get("name") or image_filename)
        return super().add_image(image_id, image_filename, image_info)

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: Dict[str, Any]) -> str:
        """MONAI Label's save_label, except that the label file is copied next to its destination first and then
        renamed over it: a reader (or a crash) never sees half a label, and an existing label stays whole until the
        new one is complete."""
        obj = self._datastore.objects.get(image_id)
        if not obj:
            raise ImageNotFoundException(f"Image {image_id} not found")
        _, label_ext = self._to_id(os.path.basename(label_filename))
        label_path = self._datastore.label_path(label_tag)
        name = self._filename(image_id, label_ext)
        with FileLock(self._lock_file):
            os.makedirs(label_path, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=label_path)
            os.close(fd)
            try:
                shutil.copyfile(label_filename, tmp)
                os.replace(tmp, os.path.join(label_path, name))
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            label_info = dict(label_info or {}, ts=int(time.time()), name=name)
            obj.labels[label_tag] = DataModel(info=label_info, ext=label_ext)
            self._update_datastore_file(lock=False)
        logger.info("label for %s saved under tag '%s' (%s)", image_id, label_tag, name)
        return image_id


def open_local(folder: Path) -> CheckedLocalDatastore:
    """A studies folder as the server opens it (same file types, labels under labels/<tag>/), without watching it."""
    if not Path(folder).is_dir():
        raise InvalidRequest(f"studies folder {folder} does not exist")
    return CheckedLocalDatastore(str(folder), extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT, auto_reload=False)
