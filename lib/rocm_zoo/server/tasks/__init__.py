"""MONAI Label infer tasks built on the rocm_zoo engine. Importing this package needs monailabel."""

from rocm_zoo.server.tasks.bundle import OverlayBundleTask
from rocm_zoo.server.tasks.deepedit import DeepEditTask

__all__ = ["OverlayBundleTask", "DeepEditTask"]
