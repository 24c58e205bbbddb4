"""DeepEdit (spleen_deepedit_annotation): clicks keyed by label name, as 3D Slicer and OHIF send them."""

from __future__ import annotations

from typing import Any, Dict, Optional

from monai.apps.deepedit.transforms import AddGuidanceSignalDeepEditd

from rocm_zoo.engine.clicks import voxel_point
from rocm_zoo.engine.guidance import DeviceGuidanceSignald
from rocm_zoo.engine.warm_volume import WarmVolume
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.registry import Request
from rocm_zoo.server.tasks.bundle import OverlayBundleTask


def _looks_like_points(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(p, (list, tuple)) for p in value)


class DeepEditTask(OverlayBundleTask):
    def label_names(self) -> dict[str, int]:
        return dict(self.bundle_config.get_parsed_content("label_names"))

    def warm_shapes(self) -> list[tuple[int, ...]]:
        # The bundle resizes every image to `spatial_size` and adds one guidance channel per label: one exact shape.
        channels = self.bundle_config.get_parsed_content("network_def#in_channels")
        spatial = self.bundle_config.get_parsed_content("spatial_size")
        return [(1, int(channels), *map(int, spatial))]

    def encode(self, request: Request, volume: WarmVolume) -> Optional[Dict[str, Any]]:
        # Slicer and OHIF send one key per label with its clicks (the automatic task gets them too and ignores them).
        if request.kind == "click":
            return {request.organ: [volume.click], "background": []}
        return super().encode(request, volume)

    def pre_transforms(self, data=None):
        return [DeviceGuidanceSignald.replacing(t) if isinstance(t, AddGuidanceSignalDeepEditd) else t
                for t in super().pre_transforms(data)]

    def prepare_request(self, data: Dict[str, Any]) -> None:
        labels = self.label_names()
        shape = [int(s) for s in data[self.input_key].meta["spatial_shape"]]
        for key, value in list(data.items()):
            if not _looks_like_points(value):
                continue
            if key not in labels:
                raise InvalidRequest(
                    f"Clicks for unknown label '{key}'; model '{self.entry.name}' knows: {', '.join(labels)}"
                )
            if self.entry.kind != "deepedit":  # the automatic task ignores clicks: zero guidance
                data[key] = []
                continue
            for point in value:
                voxel_point(point, shape, f"Click {point} on '{key}'")
