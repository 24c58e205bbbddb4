"""Batch segmentation of datastore studies, by default inside the server process with the models it already warmed.

MONAI Label's `POST /batch/infer/{model}` starts a new Python process unless `run_sync=true`; that process builds and
compiles every network again, and `run_sync` holds the HTTP request for the whole batch. Here a batch is a thread of
the server that hands the studies to an engine: `InProcessEngine` calls the app's own `infer` (warm tasks, the same
writer) for one study after another; `rocm_zoo.scale.ray_batch.RayEngine` spreads them over Ray workers. Both record every
study's outcome, keep going when one fails, and save each label with `save_study_label`, so the two write labels the
same way. Progress (done / total / failed, rate, ETA) is readable while it runs. Labels are saved under a tag (default
`original`); the clinician's `final` tag is refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.errors import Busy, InvalidRequest

logger = logging.getLogger(__name__)

PROTECTED_TAGS = ("final",)  # what annotators saved by hand: a batch never writes over it
SELECTIONS = ("all", "labeled", "unlabeled")


def check_tag(tag: str) -> None:
    if tag in PROTECTED_TAGS:
        raise InvalidRequest(f"label_tag '{tag}' holds labels annotators saved; a batch never overwrites them. "
                             "Use another tag (default 'original').")


def select_images(store, selection: str) -> list[str]:
    """The datastore's image ids for a batch selection: all, labeled (any tag) or unlabeled."""
    if selection not in SELECTIONS:
        raise InvalidRequest(f"images must be one of {', '.join(SELECTIONS)}, not '{selection}'")
    if selection == "labeled":
        return store.get_labeled_images()
    if selection == "unlabeled":
        return store.get_unlabeled_images()
    return store.list_images()


def save_study_label(store, image_id: str, label_file: str, tag: str, model: str, params: dict) -> str:
    """The label file a task wrote, saved in the datastore under `tag` (the datastore's own writer: atomic for the
    local one), then the task's temporary file removed. What every batch engine calls, so labels are the same."""
    check_tag(tag)
    if not label_file:
        raise InvalidRequest(f"{model} wrote no label for '{image_id}'")
    try:
        return store.save_label(image_id, label_file, tag, {"model": model, "params": params})
    finally:
        if os.path.exists(label_file):
            os.remove(label_file)


@dataclass
class StudyOutcome:
    image: str
    ok: bool
    seconds: float
    reason: str = ""
    attempts: int = 1  # more than 1 when the worker segmenting it died and it ran again elsewhere
    worker: str = ""


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
    error: str = ""  # why the engine stopped early (not a study's failure)

    def progress(self) -> dict[str, Any]:
        done = len(self.outcomes)
        failed = [o for o in self.outcomes if not o.ok]
        elapsed = (self.finished or time.time()) - self.started
        rate = done / elapsed * 60 if elapsed > 0 and done else 0.0
        left = len(self.images) - done
        return {
            "id": self.id, "model": self.model, "label_tag": self.tag, "state": self.state, "error": self.error,
            "total": len(self.images), "done": done, "failed": len(failed),
            "elapsed_s": round(elapsed, 1), "studies_per_min": round(rate, 2),
            "eta_s": round(left / rate * 60, 1) if rate and self.state == "running" else None,
            "failures": [{"image": o.image, "reason": o.reason} for o in failed],
            "seconds_per_study": {o.image: round(o.seconds, 2) for o in self.outcomes if o.ok},
        }

    def report(self) -> dict[str, Any]:
        """Progress plus one entry per study (those not reached when a run stops are listed as not run)."""
        seen = {o.image: o for o in self.outcomes}
        studies = [{"image": o.image, "ok": o.ok, "seconds": round(o.seconds, 2), "attempts": o.attempts,
                    "worker": o.worker, "reason": o.reason} for o in self.outcomes]
        studies += [{"image": i, "ok": False, "seconds": 0.0, "attempts": 0, "worker": "", "reason": "not run"}
                    for i in self.images if i not in seen]
        return {**self.progress(), "studies": studies}


class BatchEngine(Protocol):
    """Runs a batch: appends one StudyOutcome per study to `run.outcomes` as each finishes, stops submitting new
    studies once `run.stop_requested` is set."""

    def __call__(self, run: BatchRun, params: dict) -> None: ...


# How often a batch waiting for the server's requests to finish looks again.
YIELD_POLL_S = 0.02


class InProcessEngine:
    """One study after another through the app's `infer` (request dict -> result dict), in this process.

    A study starts only while `requests_running()` is false: the batch is below every request in the scheduler's
    order, and its host and device work between network runs (loading, resampling, stitching, writing) would
    otherwise slow the clicks and automatic requests that its turns already give way to."""

    def __init__(self, infer: Callable[[dict], dict], save: Callable[..., str],
                 requests_running: Callable[[], bool] = lambda: False):
        self._infer = infer
        self._save = save  # save_study_label bound to the app's datastore
        self._requests_running = requests_running

    def __call__(self, run: BatchRun, params: dict) -> None:
        for image in run.images:
            while self._requests_running() and not run.stop_requested:
                time.sleep(YIELD_POLL_S)
            if run.stop_requested:
                return
            start = time.perf_counter()
            request = {**params, "model": run.model, "image": image, "save_label": False}
            try:
                with working_as(Work(Priority.BATCH, f"batch {run.id}", what=f"batch {run.id} ({run.model})")):
                    result = self._infer(request)
                self._save(image, result["file"], run.tag, run.model, result["params"])
                run.outcomes.append(StudyOutcome(image, True, time.perf_counter() - start))
            except Exception as e:  # one bad study is reported, the batch goes on
                reason = f"{type(e).__name__}: {first_line(e)}"
                logger.warning("batch %s: %s failed: %s", run.id, image, reason)
                run.outcomes.append(StudyOutcome(image, False, time.perf_counter() - start, reason))


class BatchRunner:
    """One batch at a time per server. `select` turns a selection (all, labeled, unlabeled) into image ids."""

    def __init__(self, engine: BatchEngine, select: Callable[[str], list[str]],
                 check_ids: Callable[[list], list[str]] | None = None):
        self.engine = engine
        self._select = select
        self._check_ids = check_ids  # image_ids -> the same ids, or an error (unknown id, not a list)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.current: BatchRun | None = None
        self.history: list[BatchRun] = []

    def start(self, model: str, selection: str = "all", tag: str = "original", params: dict | None = None,
              image_ids: list[str] | None = None) -> BatchRun:
        check_tag(tag)
        if not image_ids and selection not in SELECTIONS:
            raise InvalidRequest(f"images must be one of {', '.join(SELECTIONS)}, not '{selection}'")
        if image_ids and self._check_ids is not None:
            image_ids = self._check_ids(image_ids)
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
        try:
            self.engine(run, params)
        except Exception as e:  # the engine itself failed (e.g. Ray unreachable): the batch says why
            logger.exception("batch %s: engine failed", run.id)
            run.error = f"{type(e).__name__}: {first_line(e)}"
        unfinished = len(run.outcomes) < len(run.images)
        run.state = "stopped" if run.error or (run.stop_requested and unfinished) else "done"
        run.finished = time.time()
        p = run.progress()
        logger.info("batch %s %s: %d/%d done, %d failed, %.2f studies/min", run.id, run.state, p["done"], p["total"],
                    p["failed"], p["studies_per_min"])
