"""MONAI Label infer tasks built on the rocm_zoo engine, and the one way to build one for a registry entry (the
server's app and Ray batch workers alike). Importing this package needs monailabel."""

from __future__ import annotations

from pathlib import Path

from rocm_zoo.engine.image_cache import ImageCache
from rocm_zoo.engine.pool import NetworkPool
from rocm_zoo.registry import BUNDLES, TaskEntry
from rocm_zoo.server.tasks.bundle import OverlayBundleTask
from rocm_zoo.server.tasks.deepedit import DeepEditTask
from rocm_zoo.server.tasks.segmentation import SegmentationTask
from rocm_zoo.server.tasks.vista3d import Vista3dTask

__all__ = ["OverlayBundleTask", "DeepEditTask", "SegmentationTask", "Vista3dTask", "TASK_CLASSES", "make_task"]

# The task class for each kind of bundle (rocm_zoo.registry.BUNDLE_KINDS); the registry gives each bundle its kind.
TASK_CLASSES: dict[str, type[OverlayBundleTask]] = {
    "deepedit": DeepEditTask,
    "vista3d": Vista3dTask,
    "sliding_window": SegmentationTask,
}


def make_task(entry: TaskEntry, bundle_dir: Path, overlays: tuple[Path, ...], pool: NetworkPool,
              image_cache: ImageCache, device: str) -> OverlayBundleTask:
    """The task the server builds for a registry entry; Ray batch workers build theirs with the same call."""
    return TASK_CLASSES[BUNDLES[entry.bundle].kind](entry, bundle_dir, overlays, pool, image_cache, device)
