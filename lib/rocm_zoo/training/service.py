"""The server's trainings: one at a time, in a background thread, at the device scheduler's lowest class; several
models asked at once (OHIF's "Update Model") run one after the other. Each finished training that beats the served
weights on validation is published: kept as a checkpoint, made the served weights file, and copied into the warm
networks in place. Status records follow MONAI Label's (`GET /train/` answers what its own task list answers).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from rocm_zoo.engine.scheduler import Priority, Work
from rocm_zoo.errors import TrainingRunning
from rocm_zoo.training.runner import Outcome, Progress, TrainingRun, TrainPlan

logger = logging.getLogger(__name__)

HISTORY = 50  # finished trainings kept for GET /train/?all=true


@dataclass
class TrainJob:
    model: str  # the model name clients use (`--conf models`)
    plan: TrainPlan
    labels: list[str]  # the image ids of the final labels it trains and validates on
    request: dict[str, Any] = field(default_factory=dict)
    fingerprint: list = field(default_factory=list)  # what the labels were (to know later whether they changed)


@dataclass
class Record:
    """One training as `GET /train/` shows it (MONAI Label's task record: id, name, status, request, times)."""

    job: TrainJob
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = "QUEUED"  # QUEUED, RUNNING, DONE, STOPPED, ERROR
    start_ts: float = 0.0
    end_ts: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    run: TrainingRun | None = None

    def as_json(self) -> dict[str, Any]:
        progress = self.run.progress.as_stats() if self.run else {}
        return {"id": self.id, "name": "train", "model": self.job.model, "status": self.status,
                "request": self.job.request, "start_ts": int(self.start_ts), "end_ts": int(self.end_ts),
                "progress": progress, "result": self.result}


# What the server does with a training's outcome (keep the checkpoint, serve it); returns what the record shows.
Publish = Callable[[TrainJob, Outcome], dict[str, Any]]


class TrainingService:
    def __init__(self, publish: Publish, priority: Priority = Priority.BACKGROUND):
        self._publish = publish
        self._priority = priority
        self._lock = threading.Lock()
        self._queue: list[Record] = []
        self._current: Record | None = None
        self._history: list[Record] = []
        self._last: dict[str, Progress] = {}  # per model: the latest training's progress (the viewers' train_stats)
        self._thread: threading.Thread | None = None

    def start(self, jobs: list[TrainJob], enqueue: bool = False) -> list[Record]:
        """Queue `jobs` and start them in order. While a training runs, a new request is refused (429), as MONAI
        Label refuses it, unless `enqueue` puts it behind the running one."""
        with self._lock:
            records = [Record(job) for job in jobs]
            if self._busy():
                if not enqueue:
                    running = self._current.job.model if self._current else self._queue[0].job.model
                    raise TrainingRunning(f"A training is already running ({running}); wait for it to end, stop it "
                                          "with DELETE /train/, or ask again with enqueue=true")
                self._queue.extend(records)
                return records
            self._queue.extend(records)
            self._thread = threading.Thread(target=self._work, name="rocm_zoo-train", daemon=True)
            self._thread.start()
        return records

    def stop(self) -> list[dict[str, Any]]:
        """Stops the running training at its next iteration and drops the queued ones; the served weights stay."""
        with self._lock:
            dropped, self._queue = self._queue, []
            for record in dropped:
                record.status, record.end_ts = "STOPPED", time.time()
                record.result = {"reason": "stopped before it started"}
                self._history.append(record)
            current = self._current
        if current and current.run:
            current.run.stop()
        return [r.as_json() for r in ([current] if current else []) + dropped]

    def running(self) -> dict[str, Any] | None:
        with self._lock:
            return self._current.as_json() if self._current else None

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            everything = self._history + ([self._current] if self._current else []) + self._queue
            return [r.as_json() for r in everything]

    def stats(self, model: str) -> dict[str, Any]:
        progress = self._last.get(model)
        return progress.as_stats() if progress else {}

    def wait(self, timeout: float | None = None) -> bool:
        """For tools and tests: True once nothing runs or waits."""
        thread = self._thread
        if thread:
            thread.join(timeout)
        return not self._busy()

    def _busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    def _work(self) -> None:
        with self._lock:
            record = self._next()
        while record is not None:
            outcome = record.run.run()
            result: dict[str, Any] = {"state": outcome.state, "reason": outcome.reason, "published": False}
            if outcome.state == "done":
                try:
                    result.update(self._publish(record.job, outcome))
                except Exception as e:  # the served weights stay as they were
                    logger.exception("publishing the training of %s failed", record.job.model)
                    outcome.state = "failed"
                    result.update(state="failed", reason=f"could not publish: {type(e).__name__}: {e}")
            logger.info("training of %s: %s", record.job.model, result)
            with self._lock:
                record.status = {"done": "DONE", "stopped": "STOPPED"}.get(outcome.state, "ERROR")
                record.end_ts, record.result = time.time(), result
                self._history = (self._history + [record])[-HISTORY:]
                record = self._next()

    def _next(self) -> Record | None:
        """The next queued training, made current (under the lock: `start` sees the worker busy until it is done)."""
        record = self._current = self._queue.pop(0) if self._queue else None
        if record is not None:
            record.status, record.start_ts = "RUNNING", time.time()
            record.run = TrainingRun(record.job.plan, Work(self._priority, "training",
                                                           what=f"training {record.job.model}"))
            self._last[record.job.model] = record.run.progress
        return record
