"""MONAI Label's local datastore, refusing uploads that are not readable volumes."""

from __future__ import annotations

from typing import Any, Dict

from monailabel.datastore.local import LocalDatastore

from rocm_zoo.volume_check import check_volume


class CheckedLocalDatastore(LocalDatastore):
    def add_image(self, image_id: str, image_filename: str, image_info: Dict[str, Any]) -> str:
        check_volume(image_filename, image_info.get("name") or image_filename)
        return super().add_image(image_id, image_filename, image_info)
