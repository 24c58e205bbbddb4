"""Batch segmentation of datastore studies inside the server process, with the models the server already warmed.

MONAI Label's `POST /batch/infer/{model}` starts a new Python process unless `run_sync=true`; that process builds and
compiles every network again, and `run_sync` holds the HTTP request for the whole batch. Here a batch is a thread of
the server: it calls the app's own `infer` (warm tasks, the same writer) for one study after another, records every
study's outcome, and keeps going when one fails. Progress (done / total / failed, rate, ETA) is readable while it
runs. Labels are saved under a tag (default `original`); the clinician's `final` tag is refused.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from rocm_zoo.errors import Busy, InvalidRequest
from rocm_zoo.volume_check import first_line

logger = logging.getLogger(__name__)

PROTECTED_TAGS = ("final",)  # what annotators saved by hand: a batch never writes over it
SELECTIONS = ("all", "labeled", "unlabeled")


@dataclass
class StudyOutcome:
    image: str
    ok: bool
    seconds: float
    reason: str = ""


@dataclass
class BatchRun:
    model: str
    tag: str
    images: list[str]
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    state: str = "running"  # running, done, stopped
    started: float = field(default_factory=time.time)
    finished: float | None = None
    outcomes: list[StudyOutcome] = field(default_factory=list)
    stop_requested: bool = False

    def progress(self) -> dict[str, Any]:
        done = len(self.outcomes)
        failed = [o for o in self.outcomes if not o.ok]
        elapsed = (self.finished or time.time()) - self.started
        rate = done / elapsed * 60 if elapsed > 0 and done else 0.0
        left = len(self.images) - done
        return {
            "id": self.id, "model": self.model, "label_tag": self.tag, "state": self.state,
            "total": len(self.images), "done": done, "failed": len(failed),
            "elapsed_s": round(elapsed, 1), "studies_per_min": round(rate, 2),
            "eta_s": round(left / rate * 60, 1) if rate and self.state == "running" else None,
            "failures": [{"image": o.image, "reason": o.reason} for o in failed],
            "seconds_per_study": {o.image: round(o.seconds, 2) for o in self.outcomes if o.ok},
        }


class BatchRunner:
    """One batch at a time per server. `infer` is the app's infer (request dict -> result dict)."""

    def __init__(self, infer: Callable[[dict], dict], select: Callable[[str], list[str]]):
        self._infer = infer
        self._select = select
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.current: BatchRun | None = None
        self.history: list[BatchRun] = []

    def start(self, model: str, selection: str = "all", tag: str = "original", params: dict | None = None,
              image_ids: list[str] | None = None) -> BatchRun:
        if tag in PROTECTED_TAGS:
            raise InvalidRequest(f"label_tag '{tag}' holds labels annotators saved; a batch never overwrites them. "
                                 "Use another tag (default 'original').")
        if not image_ids and selection not in SELECTIONS:
            raise InvalidRequest(f"images must be one of {', '.join(SELECTIONS)}, not '{selection}'")
        images = list(image_ids) if image_ids else self._select(selection)
        with self._lock:
            if self.running():
                raise Busy(f"batch {self.current.id} ({self.current.model}) is still running; "
                           "GET /batch/infer for its progress, DELETE /batch/infer to stop it")
            run = BatchRun(model=model, tag=tag, images=images)
            self.current = run
            self.history.append(run)
            self._thread = threading.Thread(target=self._run, args=(run, dict(params or {})),
                                            name=f"rocm_zoo-batch-{run.id}", daemon=True)
            self._thread.start()
        logger.info("batch %s: %s over %d studies, tag '%s'", run.id, model, len(images), tag)
        return run

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> BatchRun | None:
        if self.current is not None and self.running():
            self.current.stop_requested = True
        return self.current

    def _run(self, run: BatchRun, params: dict) -> None:
        for image in run.images:
            if run.stop_requested:
                run.state = "stopped"
                break
            start = time.perf_counter()
            request = {**params, "model": run.model, "image": image, "save_label": True, "label_tag": run.tag}
            try:
                self._infer(request)
                run.outcomes.append(StudyOutcome(image, True, time.perf_counter() - start))
            except Exception as e:  # one bad study is reported, the batch goes on
                reason = f"{type(e).__name__}: {first_line(e)}"
                logger.warning("batch %s: %s failed: %s", run.id, image, reason)
                run.outcomes.append(StudyOutcome(image, False, time.perf_counter() - start, reason))
        else:
            run.state = "done"
        run.finished = time.time()
        p = run.progress()
        logger.info("batch %s %s: %d/%d done, %d failed, %.2f studies/min", run.id, run.state, p["done"], p["total"],
                    p["failed"], p["studies_per_min"])
