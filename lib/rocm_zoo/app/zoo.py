"""Composes the app: finds bundles, builds one task per registry entry over a shared pool, warms them."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from rocm_zoo.app import heap
from rocm_zoo.app.config import AppConfig
from rocm_zoo.app.startup_log import WARM_THREAD, quiet_startup_logs
from rocm_zoo.engine.backend import apply_env_defaults, describe, detect_backend, use_persistent_compile_cache
from rocm_zoo.engine.image_cache import ImageCache
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkPool
from rocm_zoo.errors import BundleNotFound
from rocm_zoo.registry import TaskEntry, find_bundle, tasks_of
from rocm_zoo.server.tasks import OverlayBundleTask, make_task

logger = logging.getLogger(__name__)


class Zoo:
    def __init__(self, app_dir: Path, conf: dict[str, str]):
        self.config = AppConfig.from_conf(conf)
        self.model_dir = Path(app_dir) / "model"
        self.overlays_dir = OVERLAYS_DIR
        use_persistent_compile_cache(self.model_dir / ".cache" / "inductor")
        self.backend = detect_backend(self.config.device)
        quiet_startup_logs(gpu=self.backend.device != "cpu")
        applied = apply_env_defaults(self.backend)
        logger.info("rocm_zoo: %s", describe(self.backend))
        if applied:
            logger.info("rocm_zoo: ROCm environment defaults set: %s", applied)
        self.pool = NetworkPool()
        self.image_cache = ImageCache(int(self.config.image_cache_gb * 2**30))
        self.tasks: dict[str, OverlayBundleTask] = {}
        self.missing: dict[str, str] = {}
        self.warm_state: dict[str, str] = {}  # per task: pending, warming, warm (N s), failed: why
        self._background: threading.Thread | None = None
        self.heap = heap.watch()
        for model in self.config.models:
            for entry in tasks_of(model):
                self._add(entry)
        if not self.tasks:
            raise BundleNotFound("No model could be loaded. " + " ".join(dict.fromkeys(self.missing.values())))

    def _add(self, entry: TaskEntry) -> None:
        try:
            bundle_dir = find_bundle(entry.bundle, self.model_dir)
        except BundleNotFound as e:
            self.missing[entry.name] = str(e)
            logger.error("rocm_zoo: %s", self.missing[entry.name])
            return
        overlay = overlay_path(self.overlays_dir, entry.bundle)
        self.tasks[entry.name] = make_task(entry, bundle_dir, (overlay,), self.pool, self.image_cache,
                                           self.backend.device)

    def warm(self, background: bool = True) -> None:
        """Interactive models first, then the automatic ones. In the background (the server's way) the server answers
        meanwhile: `/health/ready` says 503 until every interactive model is warm, and a request for a model still
        warming runs it eager (same weights, layout and autocast) as soon as it is loaded, until its compiled graphs
        are warm (one build per network, none in a request)."""
        interactive = [t for t in self.tasks.values() if t.entry.interactive]
        batch = [t for t in self.tasks.values() if not t.entry.interactive]
        for task in self.tasks.values():
            self.warm_state[task.entry.name] = "pending"
        if not background:
            self._warm_all(interactive + batch, reraise_interactive=True)
            return
        for task in self.tasks.values():  # until its warm-up compiles it, a model's requests run it eager
            task.compile_in_requests = False
        self._background = threading.Thread(target=self._warm_all, args=(interactive + batch,), name=WARM_THREAD,
                                            daemon=True)
        self._background.start()

    def wait_warm(self) -> None:
        """Returns once the background warm-up, heap freeze included, is over (at once when none runs)."""
        if self._background is not None:
            self._background.join()

    def _warm_all(self, tasks: list[OverlayBundleTask], reraise_interactive: bool = False) -> None:
        for task in tasks:
            self._warm_one(task, reraise=reraise_interactive and task.entry.interactive)
        if self.config.gc_freeze:
            self.heap.freeze_warm_heap()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when every interactive model is warm (all of them when warm-up is off: the operator chose)."""
        interactive = [n for n, t in self.tasks.items() if t.entry.interactive]
        waiting = [n for n in interactive if self.warm_state.get(n, "warm").split()[0] != "warm"]
        return not waiting, {"not_ready": waiting, "models": dict(self.warm_state)}

    def _warm_one(self, task: OverlayBundleTask, reraise: bool) -> None:
        name = task.entry.name
        self.warm_state[name] = "warming"
        start = time.perf_counter()
        try:
            task.warm()
        except Exception as e:
            # A batch model that cannot warm must not take the server down with it; its requests will say why.
            self.warm_state[name] = f"failed: {type(e).__name__}: {e}"
            logger.exception("rocm_zoo: %s could not be warmed", name)
            if reraise:
                raise
            return
        seconds = time.perf_counter() - start
        self.warm_state[name] = f"warm ({seconds:.1f} s)"
        logger.info("rocm_zoo: %s warm (%.1f s)", name, seconds)

    def info(self) -> dict[str, Any]:
        return {"backend": describe(self.backend), "missing": self.missing, "warm": dict(self.warm_state),
                "heap": self.heap.info()}
