"""The Ray side of a batch: joining or starting a cluster, and a set of warm segmentation workers on it.

One worker per GPU (`num_gpus=1`, so Ray gives each its own device), or on a machine without GPUs N CPU workers that
split the cores between them (Ray sets each worker's thread count to its CPUs). A worker whose process dies is
restarted by Ray up to `restarts` times (it warms again, from the on-disk compile cache); one that cannot be
restarted, or was killed with `ray.kill`, is dropped and the batch goes on with the others.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_zoo.errors import ConfigError, RocmZooError
from rocm_zoo.names import did_you_mean
from rocm_zoo.registry import TASKS, batch_models, find_bundle
from rocm_zoo.scale.ray_worker import SegmentationWorker, WorkerSpec

logger = logging.getLogger(__name__)


class RayUnavailable(RocmZooError):
    """The Ray cluster named by --address cannot be reached, or it cannot hold the workers asked for."""

    status = 503


def require_ray() -> None:
    """Ray is an optional extra; without it the batch says how to get it instead of failing on an import."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("Ray is not installed in this Python environment: pip install -e '.[ray]' "
                          "(scripts/setup-venv installs it), or use the in-process batch (--conf batch_engine inprocess)")


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Joins the cluster at `address`, or starts a local one bound to 127.0.0.1 without a dashboard. Ray picks its
    own free ports. Once per process: a second call keeps the first connection."""
    require_ray()
    import ray

    if ray.is_initialized():
        return
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayUnavailable(f"cannot reach a Ray cluster at {address}: {e}. Start one with "
                                 "`ray start --head` on the head node (same Python and rocm_zoo on every node), "
                                 "or leave --address out to run on this machine only.") from e
        return
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level=logging.WARNING)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A HOST:PORT that does not accept a connection fails here, in seconds; ray.init would retry for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"cannot reach a Ray cluster at {address}: {e}. Start one with `ray start --head "
                             "--port PORT` on the head node (same Python and rocm_zoo on every node), or leave "
                             "--address out to run on this machine only.") from e


def worker_spec(model: str, model_dir: Path, overlays_dir: Path, extra_overlays: tuple[Path, ...] = (),
                device: str = "auto") -> WorkerSpec:
    """What each worker builds, checked here on the driver: a batch model, its bundle present."""
    from rocm_zoo.engine.overlay import overlay_path

    models = batch_models()
    if model not in models:
        hint = did_you_mean(model, models)
        raise ConfigError(f"'{model}' is not a batch model.{hint} Batch models: {', '.join(models)}")
    entry = TASKS[model]
    find_bundle(entry.bundle, Path(model_dir))
    bundle_dir = Path(model_dir).resolve() / entry.bundle
    overlays = (overlay_path(Path(overlays_dir), entry.bundle), *extra_overlays)
    return WorkerSpec(model, str(bundle_dir), tuple(str(Path(o).resolve()) for o in overlays), device)


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    gpus_per_worker: int  # 1, or 0 for CPU workers
    cpus_per_worker: int


def plan_workers(requested: int, device: str) -> WorkerPlan:
    """How many workers and what each holds, from what the cluster has. `requested` 0: one per GPU of the cluster,
    or one CPU worker with a node's cores."""
    import ray

    total = ray.cluster_resources()
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    gpus, cpus = int(total.get("GPU", 0)), int(total.get("CPU", 0))
    node_cpus = max((int(n.get("CPU", 0)) for n in nodes), default=cpus)
    use_gpu = device != "cpu" and gpus > 0
    if device.startswith("cuda") and not gpus:
        raise RayUnavailable(f"--device {device} asks for GPU workers but the Ray cluster has no GPU")
    workers = requested or (gpus if use_gpu else 1)
    if use_gpu and workers > gpus:
        raise RayUnavailable(f"{workers} GPU workers asked for, the Ray cluster has {gpus} GPU(s)")
    per_worker = max(1, min(node_cpus, cpus // workers))
    if not use_gpu and workers > cpus:
        raise RayUnavailable(f"{workers} CPU workers asked for, the Ray cluster has {cpus} CPU(s)")
    return WorkerPlan(workers, 1 if use_gpu else 0, per_worker)


@dataclass
class WorkerPool:
    """Started workers, and what happened to them (deaths, restarts, drops) for the report."""

    spec: WorkerSpec
    plan: WorkerPlan
    restarts: int = 1
    actors: list = field(default_factory=list)
    info: dict[int, dict[str, Any]] = field(default_factory=dict)  # by position in `actors`: name, pid, warm_s
    events: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> list[dict[str, Any]]:
        """Starts every worker and waits until each is warm; a worker that cannot start fails the batch with its
        reason (a missing bundle on that host, a GPU it cannot use), before any study is given out."""
        import ray

        remote = ray.remote(SegmentationWorker).options(
            num_gpus=self.plan.gpus_per_worker, num_cpus=self.plan.cpus_per_worker,
            max_restarts=self.restarts, max_task_retries=0)
        device = "cuda" if self.plan.gpus_per_worker else "cpu"
        spec = WorkerSpec(self.spec.model, self.spec.bundle_dir, self.spec.overlays, device)
        self.actors = [remote.remote(spec) for _ in range(self.plan.workers)]
        described = ray.get([a.describe.remote() for a in self.actors])
        self.info = dict(enumerate(described))
        for d in described:
            logger.info("ray worker %s on %s warm in %.1f s", d["name"], d["device"], d["warm_s"])
        return described

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
