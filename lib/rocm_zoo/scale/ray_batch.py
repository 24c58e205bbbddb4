"""Batch segmentation over Ray workers, fed and written by this process (the driver).

The driver owns the datastore: it reads each study's file, sends its bytes to a worker (two studies queued per worker,
so the next one is already there when a study finishes), and saves the label the worker sends back with the same
`save_study_label` the in-process batch uses (same tag check, same atomic datastore write). Workers need no shared
filesystem with the driver.

A study whose worker died (process killed, out of memory, node lost) was not segmented: it goes back to the queue and
runs on another worker, at most `max_retries` more times; a study that fails with an ordinary error (a file that
cannot be read) is reported once, with its reason, and not retried. The crashed worker is asked for a sign of life:
Ray restarts it if it may (it rejoins once warm), otherwise it is dropped. When no worker is left, the studies not
yet run are reported as failed with that reason.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.scale.ray_pool import WorkerPool, connect, plan_workers, require_ray, worker_spec
from rocm_zoo.server.batch.runs import BatchRun, StudyOutcome, check_tag, save_study_label

logger = logging.getLogger(__name__)

IN_FLIGHT_PER_WORKER = 2
REVIVE_POLL_S = 1.0


def _lost_errors() -> tuple[type, ...]:
    """Errors that mean the worker, not the study, failed: the study was not segmented and may run elsewhere."""
    from ray import exceptions as rx

    return (rx.RayActorError, rx.WorkerCrashedError, rx.OutOfMemoryError, rx.ObjectLostError, rx.NodeDiedError)


class RayEngine:
    """A BatchEngine (see tasks.batch) over Ray workers. `pool_for(model)` gives the warm workers of a model;
    `store()` the datastore the labels go to."""

    def __init__(self, pool_for: Callable[[str], WorkerPool], store: Callable[[], Any], max_retries: int = 2,
                 on_outcome: Callable[[BatchRun, StudyOutcome], None] | None = None):
        self.pool_for = pool_for
        self.store = store
        self.max_retries = max_retries
        self.on_outcome = on_outcome

    def __call__(self, run: BatchRun, params: dict) -> None:
        import ray

        check_tag(run.tag)
        pool = self.pool_for(run.model)
        store = self.store()
        lost = _lost_errors()
        pending = collections.deque(run.images)
        attempts: collections.Counter = collections.Counter()
        slots = [i for i in range(len(pool.actors)) for _ in range(IN_FLIGHT_PER_WORKER)]
        running: dict[Any, tuple[str, int, float]] = {}  # result ref -> (image, worker index, submitted at)
        reviving: dict[Any, int] = {}  # describe() ref of a worker that crashed -> worker index
        dead: set[int] = set()

        def record(outcome: StudyOutcome) -> None:
            run.outcomes.append(outcome)
            if self.on_outcome:
                self.on_outcome(run, outcome)

        while pending or running or reviving:
            while pending and slots and not run.stop_requested:
                image, worker = pending.popleft(), slots.pop(0)
                try:
                    path = _study_file(store, image)
                    data = Path(path).read_bytes()
                except Exception as e:  # the driver cannot read it: no worker would do better
                    record(StudyOutcome(image, False, 0.0, f"{type(e).__name__}: {first_line(e)}", attempts[image] + 1))
                    slots.insert(0, worker)
                    continue
                ref = pool.actors[worker].segment.remote(os.path.basename(path), data, params)
                running[ref] = (image, worker, time.perf_counter())
            if run.stop_requested and not running and not reviving:
                return
            if not running and not reviving:  # studies left, no worker left
                for image in pending:
                    record(StudyOutcome(image, False, 0.0, "no live Ray worker left (all died; see the worker events)",
                                        attempts[image]))
                return
            ready, _ = ray.wait(list(running) + list(reviving), num_returns=1)
            ref = ready[0]
            if ref in reviving:
                worker = reviving.pop(ref)
                try:
                    info = ray.get(ref)
                except ray.exceptions.ActorUnavailableError:  # still restarting: ask again shortly
                    time.sleep(REVIVE_POLL_S)
                    reviving[pool.actors[worker].describe.remote()] = worker
                    continue
                except lost as e:
                    dead.add(worker)
                    pool.events.append(_event(pool, worker, "dropped", first_line(e)))
                    logger.warning("ray worker %s dropped: %s", pool.info[worker]["name"], first_line(e))
                    continue
                pool.events.append(_event(pool, worker, "restarted", f"now {info['name']}, warm in {info['warm_s']} s"))
                pool.info[worker] = info
                slots.extend([worker] * IN_FLIGHT_PER_WORKER)
                continue
            image, worker, submitted = running.pop(ref)
            attempts[image] += 1
            try:
                result = ray.get(ref)
            except lost as e:
                # The worker died with this study on it (or queued for it).
                if worker not in dead and worker not in reviving.values():
                    pool.events.append(_event(pool, worker, "died", f"{type(e).__name__}: {first_line(e)}"))
                    reviving[pool.actors[worker].describe.remote()] = worker
                    slots = [s for s in slots if s != worker]
                if attempts[image] <= self.max_retries:
                    pending.appendleft(image)
                    logger.warning("%s lost with its worker; queued again (attempt %d of %d)", image,
                                   attempts[image] + 1, self.max_retries + 1)
                else:
                    record(StudyOutcome(image, False, time.perf_counter() - submitted,
                                        f"its worker died {attempts[image]} times: {type(e).__name__}: "
                                        f"{first_line(e)}", attempts[image]))
                continue
            except Exception as e:  # the study failed in a live worker: reported, not retried
                cause = getattr(e, "cause", None) or e
                slots.append(worker)
                record(StudyOutcome(image, False, time.perf_counter() - submitted,
                                    f"{type(cause).__name__}: {first_line(cause)}", attempts[image],
                                    pool.info[worker]["name"]))
                continue
            slots.append(worker)
            try:
                _save(store, image, result, run)
                record(StudyOutcome(image, True, result["seconds"], "", attempts[image], result["worker"]))
            except Exception as e:
                record(StudyOutcome(image, False, result["seconds"], f"{type(e).__name__}: {first_line(e)}",
                                    attempts[image], result["worker"]))


def _study_file(store, image_id: str) -> str:
    path = store.get_image_uri(image_id)
    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"'{image_id}' is not a file this driver can read ({path!r}); Ray workers get "
                                "studies as NIfTI/NRRD files from a local datastore")
    return path


def _save(store, image_id: str, result: dict, run: BatchRun) -> None:
    fd, label_file = tempfile.mkstemp(suffix=result["extension"], prefix="rocm_zoo_label_")
    with os.fdopen(fd, "wb") as f:
        f.write(result["label"])
    save_study_label(store, image_id, label_file, run.tag, run.model, result["params"])


def _event(pool: WorkerPool, worker: int, what: str, detail: str) -> dict[str, Any]:
    return {"worker": pool.info.get(worker, {}).get("name", str(worker)), "event": what, "detail": detail,
            "time": round(time.time(), 1)}


def progress_line(run: BatchRun) -> str:
    p = run.progress()
    eta = f", ETA {_duration(p['eta_s'])}" if p["eta_s"] is not None else ""
    return (f"{p['done']}/{p['total']} done, {p['failed']} failed, {p['studies_per_min']:.1f} studies/min, "
            f"{_duration(p['elapsed_s'])} elapsed{eta}")


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def server_engine(conf, model_dir: Path, overlays_dir: Path, store: Callable[[], Any]) -> RayEngine:
    """`--conf batch_engine ray`: the first batch of a model connects (or starts a local cluster) and starts its
    workers; they stay warm for the server's later batches of that model. Without Ray the server does not start."""
    require_ray()
    pools: dict[str, WorkerPool] = {}

    def pool_for(model: str) -> WorkerPool:
        if model not in pools:
            connect(conf.ray_address or None)
            spec = worker_spec(model, model_dir, overlays_dir, device=conf.device)
            pool = WorkerPool(spec, plan_workers(conf.ray_workers, conf.device))
            pool.start()
            pools[model] = pool
        return pools[model]

    return RayEngine(pool_for, store)


def run_batch(*, model: str, studies: Path, selection: str = "unlabeled", image_ids: list[str] | None = None,
              tag: str = "original", address: str | None = None, workers: int = 0, max_retries: int = 2,
              restarts: int = 1, device: str = "auto", model_dir: Path, overlays_dir: Path,
              extra_overlays: tuple[Path, ...] = (), report: Path | None = None,
              on_outcome: Callable[[BatchRun, StudyOutcome], None] | None = None) -> dict[str, Any]:
    """`rocm-zoo batch`: segments a datastore folder's studies on Ray workers and returns (and writes) the report.
    The rate counts from the first study given out, after every worker is warm."""
    from rocm_zoo.errors import InvalidRequest
    from rocm_zoo.server.batch.runs import select_images
    from rocm_zoo.server.store.datastore import open_local

    check_tag(tag)
    spec = worker_spec(model, model_dir, overlays_dir, extra_overlays, device)
    store = open_local(Path(studies))
    images = list(image_ids) if image_ids else select_images(store, selection)
    if not images:
        raise InvalidRequest(f"no studies to segment: {studies} has no {selection} images "
                             f"(NIfTI or NRRD files; labels are under {Path(studies) / 'labels'})")
    connect(address)
    plan = plan_workers(workers, device)
    pool = WorkerPool(spec, plan, restarts)
    try:
        pool.start()
        run = BatchRun(model=model, tag=tag, images=images)
        RayEngine(lambda _: pool, lambda: store, max_retries, on_outcome)(run, {})
    finally:
        pool.shutdown()
    run.state, run.finished = "done", time.time()
    record = {**run.report(), "studies_folder": str(Path(studies).resolve()), "address": address or "local",
              "plan": vars(plan), "max_retries": max_retries, "worker_restarts": restarts,
              "workers": list(pool.info.values()), "worker_events": pool.events}
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(record, indent=2))
    return record


def summary(record: dict[str, Any]) -> str:
    """The printed end of a run: totals, then each failure with its reason, then worker deaths."""
    lines = [f"{record['model']}: {record['done'] - record['failed']} of {record['total']} studies labelled "
             f"(tag '{record['label_tag']}'), {record['failed']} failed, {record['studies_per_min']:.1f} studies/min "
             f"on {record['plan']['workers']} worker(s)"]
    lines += [f"  failed {s['image']}: {s['reason']}" for s in record["studies"] if not s["ok"]]
    lines += [f"  retried {s['image']}: {s['attempts']} attempts" for s in record["studies"]
              if s["ok"] and s["attempts"] > 1]
    lines += [f"  worker {e['worker']} {e['event']}: {e['detail']}" for e in record["worker_events"]]
    return "\n".join(lines)
