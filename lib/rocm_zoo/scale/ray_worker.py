"""One Ray batch worker: the server's segmentation task, warm, in a process of its own (one GPU, or a share of CPUs).

Ray runs this class as an actor. It builds the task exactly as the server does (`tasks.zoo.make_task`: same bundle,
overlays, pool and writer), warms it when it starts (and again when Ray restarts it after a crash), then segments
one study per call. The study travels as the file's bytes and the label comes back as the label file's bytes: the
worker needs no access to the datastore, so it may run on another host; only the bundle must be at the same path
there. The driver saves the label (see ray_batch).
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    model: str  # registry task name, e.g. wholeBody_ct
    bundle_dir: str  # absolute; the same path on every host of the cluster
    overlays: tuple[str, ...]  # the bundle's overlay, then any extra ones (merged last)
    device: str  # "cuda" (the GPU Ray assigned to this worker) or "cpu"


class SegmentationWorker:
    def __init__(self, spec: WorkerSpec):
        from rocm_zoo.engine.backend import apply_env_defaults, detect_backend, use_persistent_compile_cache
        from rocm_zoo.engine.image_cache import ImageCache
        from rocm_zoo.engine.pool import NetworkPool
        from rocm_zoo.registry import TASKS
        from rocm_zoo.server.tasks import make_task

        start = time.perf_counter()
        bundle_dir = Path(spec.bundle_dir)
        use_persistent_compile_cache(bundle_dir.parent / ".cache" / "inductor")  # a restarted worker reuses kernels
        backend = detect_backend(spec.device)
        apply_env_defaults(backend)
        self.device = backend.device
        self.task = make_task(TASKS[spec.model], bundle_dir, tuple(map(Path, spec.overlays)), NetworkPool(),
                              ImageCache(0), self.device)
        self.task.warm()
        self.warm_s = round(time.perf_counter() - start, 1)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "device": self.device,
                "warm_s": self.warm_s}

    def segment(self, image_name: str, image: bytes, params: dict) -> dict[str, Any]:
        """The label of one study, as the task's writer wrote it: file bytes, extension, the task's result JSON."""
        from monailabel.utils.others.generic import file_ext

        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="rocm_zoo_ray_") as tmp:
            # Same file name as in the datastore: the writer takes the label's extension from it.
            path = Path(tmp) / image_name
            path.write_bytes(image)
            label_file, result = self.task({**params, "image": str(path)})
            try:
                label = Path(label_file).read_bytes()
            finally:
                os.remove(label_file)
        return {"label": label, "extension": file_ext(label_file), "params": result, "worker": self.name,
                "seconds": time.perf_counter() - start}
