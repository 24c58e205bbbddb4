"""`rocm-zoo bench-train`: a bundle's own train config, fp32 eager (no overlay, no autocast) vs the training overlay
(bf16 autocast, channels-last), on the same phantoms, seeds and data order, through the server's training code
(`TrainingRun`, one device turn per iteration); then, optionally, DeepEdit clicks (the warm, compiled inference
network, interactive work) every 0.3 s alone and while that training runs on the same device.

Throughput is samples per second of training iterations (median iteration time; the first iteration of each epoch,
which waits for data and follows validation, is left out). Losses of the two runs are compared iteration by
iteration. One JSON record in --out.

  rocm-zoo bench-train --model-dir /tmp/zoo/model --bundle wholeBody_ct_segmentation --phantoms 6 --epochs 3 --out $OUT
"""

from __future__ import annotations

import json
import logging
import platform
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec
from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.registry import BUNDLES, TASKS, default_task
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import training_labels
from rocm_zoo.samples.train_sample import readers_without_itk, write_training_data
from rocm_zoo.training.runner import OVERLAY_FILE, TrainingRun, TrainPlan, train_config_of

logger = logging.getLogger(__name__)

DEEPEDIT = TASKS[default_task("deepedit")].bundle
FP32_EAGER = (("train#trainer#amp", False), ("validate#evaluator#amp", False))
CLICK_EVERY_S = 0.3


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_once(bundle_dir: Path, data: list[dict], mode: str, epochs: int, device: str,
               started: list | None = None) -> dict[str, Any]:
    """One training from the same start (the bundle's weights, seed 0): mode "fp32_eager" or "overlay". The run is
    appended to `started` (to follow or stop it from another thread)."""
    overlay = overlay_path(OVERLAYS_DIR, bundle_dir.name).with_name(OVERLAY_FILE)
    config = train_config_of(bundle_dir)
    overrides = (FP32_EAGER if mode == "fp32_eager" else ()) + readers_without_itk(bundle_dir / config)
    plan = TrainPlan(bundle_dir, config, (overlay,) if mode == "overlay" else (), BUNDLES[bundle_dir.name].weights,
                     data[:-1], data[-1:], device, epochs, overrides=overrides)
    run = TrainingRun(plan, Work(Priority.BACKGROUND, "bench", what=f"training {mode}"))
    if started is not None:
        started.append(run)
    _seed(0)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    outcome = run.run()
    p = run.progress
    per_iteration = _iteration_seconds(p.iteration_ends, p.total_iterations)
    samples_s = p.samples_per_iteration / statistics.median(per_iteration) if per_iteration else None
    return {
        "mode": mode, "state": outcome.state, "reason": outcome.reason, "epochs": p.epoch,
        "iterations": len(p.iteration_ends), "samples_per_iteration": p.samples_per_iteration,
        "samples_per_s": round(samples_s, 3) if samples_s else None,
        "iteration_ms_p50": round(1000 * statistics.median(per_iteration), 1) if per_iteration else None,
        "losses": [round(x, 5) for x in p.losses], "baseline_dice": p.baseline_dice, "best_dice": p.best_dice,
        "seconds": round(time.perf_counter() - start, 1),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated(device) / 2**20) if device.startswith("cuda") else None,
    }


def _iteration_seconds(ends: list[float], per_epoch: int) -> list[float]:
    """Iteration times within each epoch (not the first of an epoch: it follows validation and a data-loader start)."""
    if per_epoch <= 1:
        return [b - a for a, b in zip(ends, ends[1:])]
    return [ends[i] - ends[i - 1] for i in range(1, len(ends)) if i % per_epoch != 0]


def compare_losses(a: list[float], b: list[float]) -> dict[str, Any]:
    n = min(len(a), len(b))
    if not n:
        return {"iterations": 0}
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    return {"iterations": n, "max_abs_diff": round(float(np.abs(x - y).max()), 5),
            "mean_rel_diff": round(float(np.mean(np.abs(x - y) / np.maximum(np.abs(x), 1e-6))), 5),
            "first": [round(float(x[0]), 5), round(float(y[0]), 5)], "last": [round(float(x[-1]), 5),
                                                                           round(float(y[-1]), 5)]}


def clicks_beside_training(model_dir: Path, bundle_dir: Path, data: list[dict], device: str, seconds: float,
                           epochs: int) -> dict[str, Any]:
    """DeepEdit clicks (warm compiled network, interactive work) alone, then while `bundle_dir` trains."""
    entry = BUNDLES[DEEPEDIT]
    spec = NetworkSpec(model_dir / DEEPEDIT, entry.config, entry.weights, (overlay_path(OVERLAYS_DIR, DEEPEDIT),),
                       device)
    size = json.loads((model_dir / DEEPEDIT / entry.config).read_text())["spatial_size"]
    shape = (1, 3, *size)
    net = NetworkPool().get(spec, [shape])
    x = torch.rand(shape)

    def clicks(until: float) -> list[float]:
        out = []
        with working_as(Work(Priority.INTERACTIVE, "clinician", what="click")):
            while time.perf_counter() < until:
                start = time.perf_counter()
                net(x)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(device)
                out.append(1000 * (time.perf_counter() - start))
                time.sleep(CLICK_EVERY_S)
        return out

    alone = clicks(time.perf_counter() + seconds / 2)
    runs: list[TrainingRun] = []
    result: dict[str, Any] = {}
    trainer = threading.Thread(target=lambda: result.update(train_once(bundle_dir, data, "overlay", epochs, device,
                                                                       runs)), daemon=True)
    trainer.start()
    while trainer.is_alive() and not (runs and runs[0].progress.iteration_ends):  # past the start's validation
        time.sleep(0.2)
    during = clicks(time.perf_counter() + seconds)
    if runs:
        runs[0].stop()
    trainer.join()
    return {"click_ms_alone": _percentiles(alone), "click_ms_during_training": _percentiles(during),
            "training_beside_clicks": {k: result.get(k) for k in ("samples_per_s", "iteration_ms_p50", "iterations",
                                                                   "state")}}


def _percentiles(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"n": 0}
    q = np.percentile(ms, [50, 90, 99])
    return {"n": len(ms), "p50": round(float(q[0]), 2), "p90": round(float(q[1]), 2), "p99": round(float(q[2]), 2)}


def run(model_dir: Path, bundle: str, phantoms: int, epochs: int, device: str, out: Path,
        click_seconds: float = 0.0) -> dict[str, Any]:
    bundle_dir = Path(model_dir) / bundle
    data = write_training_data(training_labels(bundle), Path(out) / "train_data" / bundle,
                               phantom.training_specs(phantoms))
    record: dict[str, Any] = {"bundle": bundle, "phantoms": phantoms, "epochs": epochs, "device": device,
                              "versions": _versions(device), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                    time.gmtime())}
    for mode in ("fp32_eager", "overlay"):
        record[mode] = train_once(bundle_dir, data, mode, epochs, device)
        logger.info("%s %s: %s samples/s", bundle, mode, record[mode]["samples_per_s"])
        _write(out, bundle, record)
    fp32, overlay = record["fp32_eager"]["samples_per_s"], record["overlay"]["samples_per_s"]
    record["speedup"] = round(overlay / fp32, 3) if fp32 and overlay else None
    record["loss_agreement"] = compare_losses(record["fp32_eager"]["losses"], record["overlay"]["losses"])
    _write(out, bundle, record)
    if click_seconds > 0:
        record["clicks"] = clicks_beside_training(Path(model_dir), bundle_dir, data, device, click_seconds, 1000)
        _write(out, bundle, record)
    return record


def _write(out: Path, bundle: str, record: dict) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"train_{bundle}.json").write_text(json.dumps(record, indent=2))


def _versions(device: str) -> dict[str, Any]:
    import monai

    v = {"torch": torch.__version__, "monai": monai.__version__, "python": platform.python_version(),
         "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if device.startswith("cuda"):
        v["gpu"] = torch.cuda.get_device_name(device)
    return v
