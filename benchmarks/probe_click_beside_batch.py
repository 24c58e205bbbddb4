"""A click beside a whole-body sliding window on one GPU: which way of sharing the device keeps the click fast?

Engine level, no HTTP: the warm, compiled DeepEdit network answers a click (one 128^3 forward) every 0.3 s while
another thread runs wholeBody_ct's sliding window (96^3 windows, the bundle's inferer) over a spleen_10-shaped volume
back to back. Modes, each measured in this one process:
  alone       clicks only; and the sliding window only (its throughput is the baseline)
  one_lock    the sliding window holds the device for a whole study (MONAI Label's behaviour, and rocm_zoo's before
              the scheduler)
  scheduler   rocm_zoo's device scheduler: one turn per window batch, the click goes first, lower-priority work hands
              over once its kernels ran and queues at most one turn ahead
  stream      no turns; the click on a stream of its own (default priority)
  hp_stream   no turns; the click on a high-priority stream
Writes one JSON record (p50/p90 click ms, windows/s and its ratio to alone, versions) to --out.

  python benchmarks/probe_click_beside_batch.py --model-dir /tmp/zoo/model --out $OUT/click_beside_batch.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import threading
import time
from pathlib import Path

import torch
from monai.inferers import SlidingWindowInferer

from rocm_zoo.engine import pool as pool_module
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec
from rocm_zoo.engine.scheduler import Priority, Work, device_turn, working_as
from rocm_zoo.registry import BUNDLES

DEEPEDIT, WHOLEBODY = "spleen_deepedit_annotation", "wholeBody_ct_segmentation"
CLICK_SHAPE = (1, 3, 128, 128, 128)
WINDOW_SHAPE = (1, 1, 96, 96, 96)
VOLUME_SHAPE = (1, 1, 335, 335, 183)  # spleen_10 resampled to wholeBody's 1.5 mm (FACTS.md §3)


def network(model_dir: Path, bundle: str, shape: tuple[int, ...]):
    entry = BUNDLES[bundle]
    spec = NetworkSpec(model_dir / bundle, entry.config, entry.weights, (overlay_path(OVERLAYS_DIR, bundle),), "cuda")
    return NetworkPool().get(spec, [shape])


def run_for(targets, stop: threading.Event, seconds: float) -> float:
    """Each target in a thread of its own for `seconds`, then `stop` set and every thread joined; the seconds they
    ran, the last one's unfinished work included."""
    threads = [threading.Thread(target=target) for target in targets]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def measure(mode: str, click_net, window_net, seconds: float, clicks_on: bool, batch_on: bool) -> dict:
    device = click_net.backend.device
    x_click = torch.rand(CLICK_SHAPE, device=device)
    volume = torch.rand(VOLUME_SHAPE, device=device)
    inferer = SlidingWindowInferer(roi_size=WINDOW_SHAPE[2:], sw_batch_size=1, overlap=0.25, mode="gaussian",
                                   padding_mode="replicate")
    stop = threading.Event()
    windows = [0]
    click_ms: list[float] = []
    streams = {"stream": torch.cuda.Stream(device), "hp_stream": torch.cuda.Stream(device, priority=-3)}
    per_study = None

    def counted(x):
        windows[0] += 1
        return window_net(x)

    def batch():
        nonlocal per_study
        with working_as(Work(Priority.BATCH, "batch", what="sliding window")):
            while not stop.is_set():
                start = time.perf_counter()
                with device_turn(device) if mode == "one_lock" else contextlib.nullcontext():
                    inferer(volume, counted)
                torch.cuda.synchronize(device)
                per_study = time.perf_counter() - start

    def clicks():
        with working_as(Work(Priority.INTERACTIVE, "clinician", what="click")):
            stream = streams.get(mode)
            while not stop.is_set():
                start = time.perf_counter()
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    click_net(x_click).argmax(1).cpu()
                click_ms.append((time.perf_counter() - start) * 1000)
                time.sleep(0.3)

    elapsed = run_for(([batch] if batch_on else []) + ([clicks] if clicks_on else []), stop, seconds)
    record = {"mode": mode, "seconds": round(elapsed, 1)}
    if click_ms:
        record.update(clicks=len(click_ms), click_p50_ms=round(statistics.median(click_ms), 1),
                      click_p90_ms=round(statistics.quantiles(click_ms, n=10)[-1], 1) if len(click_ms) >= 10 else None,
                      click_max_ms=round(max(click_ms), 1))
    if batch_on:
        record.update(windows_per_s=round(windows[0] / elapsed, 1),
                      seconds_per_study=round(per_study, 3) if per_study else None)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    click_net = network(a.model_dir, DEEPEDIT, CLICK_SHAPE)
    window_net = network(a.model_dir, WHOLEBODY, WINDOW_SHAPE)
    runs = [measure("alone", click_net, window_net, a.seconds, True, False),
            measure("alone", click_net, window_net, a.seconds, False, True)]
    for mode in ("one_lock", "scheduler", "stream", "hp_stream"):
        if mode in ("stream", "hp_stream"):  # no turns at all: the streams alone share the device
            no_turns = contextlib.nullcontext
            pool_module.device_turn = lambda device: no_turns()
        else:
            pool_module.device_turn = device_turn
        runs.append(measure(mode, click_net, window_net, a.seconds, True, True))
        a.out.write_text(json.dumps(_record(runs, click_net), indent=2))
    pool_module.device_turn = device_turn
    alone_windows = runs[1]["windows_per_s"]
    for r in runs[2:]:
        r["batch_throughput_vs_alone"] = round(r["windows_per_s"] / alone_windows, 3)
    a.out.write_text(json.dumps(_record(runs, click_net), indent=2))
    for r in runs:
        print(json.dumps(r))


def _record(runs: list[dict], net) -> dict:
    return {"date": time.strftime("%Y-%m-%d"), "device": net.backend.device_name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "dtype": net.key.dtype, "compile_mode": net.key.compile_mode, "runs": runs}


if __name__ == "__main__":
    main()
