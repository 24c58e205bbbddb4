"""The click gate on one GPU: how fast is a click beside a study's sliding window with and without it, and what does
the study lose?

Engine level, no HTTP, the server's own sharing: clicks run as interactive work on their high-priority stream
(`engine.streams`), unqueued; the study is automatic work whose window batches take scheduler turns. With the gate
(`engine.scheduler`, `--conf click_gate`) no window batch starts while a click runs or its kernels are queued; without
it the click shares the GPU with whatever window batches start meanwhile. Clicks alternate between two kinds, one every
0.3 s: DeepEdit's one forward (1x3x128^3), and four such forwards in one turn, the shape of a VISTA3D click of four
points (four windows, one turn: `VistaPredictor.turn`). Modes, all in this one process, the gated ones twice in
alternation (run-to-run spread):
  alone      clicks only; the study only (its windows/s is the baseline)
  no_gate    clicks beside the study, `--conf click_gate false`
  gate       clicks beside the study, the default
Writes one JSON record (per mode and click kind p50/p90/max ms, windows/s and its ratio to alone, versions) to --out.

  python benchmarks/probe_click_gate.py --model-dir /tmp/zoo/model --out $OUT/click_gate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch
from monai.inferers import SlidingWindowInferer

from probe_click_beside_batch import CLICK_SHAPE, DEEPEDIT, VOLUME_SHAPE, WHOLEBODY, WINDOW_SHAPE, _record
from rocm_zoo.engine import scheduler, streams
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec
from rocm_zoo.engine.scheduler import Priority, Work, device_turn, working_as
from rocm_zoo.registry import BUNDLES

CLICK_KINDS = {"one forward": 1, "four windows, one turn": 4}


def network(model_dir: Path, bundle: str, shape: tuple[int, ...], device: str):
    entry = BUNDLES[bundle]
    spec = NetworkSpec(model_dir / bundle, entry.config, entry.weights, (overlay_path(OVERLAYS_DIR, bundle),), device)
    return NetworkPool().get(spec, [shape])


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def percentile(values: list[float], q: float) -> float | None:
    return round(statistics.quantiles(values, n=100)[int(q) - 1], 1) if len(values) >= 10 else None


def measure(mode: str, click_net, window_net, seconds: float, clicks_on: bool, study_on: bool) -> dict:
    device = click_net.backend.device
    x_click = torch.rand(CLICK_SHAPE, device=device)
    volume = torch.rand(VOLUME_SHAPE, device=device)
    inferer = SlidingWindowInferer(roi_size=WINDOW_SHAPE[2:], sw_batch_size=1, overlap=0.25, mode="gaussian",
                                   padding_mode="replicate")
    synchronize(device)
    stop = threading.Event()
    windows = [0]
    click_ms: dict[str, list[float]] = {kind: [] for kind in CLICK_KINDS}

    def counted(x):
        windows[0] += 1
        return window_net(x)

    def study():
        with working_as(Work(Priority.AUTOMATIC, "study", what="wholeBody_ct")):
            while not stop.is_set():
                inferer(volume, counted)
                synchronize(device)

    def clicks():
        kinds = list(CLICK_KINDS.items())
        n = 0
        with working_as(Work(Priority.INTERACTIVE, "clinician", what="click")), streams.for_work(device, True):
            while not stop.is_set():
                kind, forwards = kinds[n % len(kinds)]
                n += 1
                start = time.perf_counter()
                with device_turn(device):
                    out = sum(click_net(x_click) for _ in range(forwards))
                out.argmax(1).cpu()
                click_ms[kind].append((time.perf_counter() - start) * 1000)
                time.sleep(0.3)

    threads = ([threading.Thread(target=study)] if study_on else []) + \
              ([threading.Thread(target=clicks)] if clicks_on else [])
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    record: dict = {"mode": mode, "seconds": round(elapsed, 1)}
    for kind, ms in click_ms.items():
        if ms:
            record[kind] = {"clicks": len(ms), "p50_ms": round(statistics.median(ms), 1), "p90_ms": percentile(ms, 90),
                            "max_ms": round(max(ms), 1)}
    if study_on:
        record["windows_per_s"] = round(windows[0] / elapsed, 1)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda", help="cuda (what it is for); cpu only checks that it runs")
    a = p.parse_args()
    click_net = network(a.model_dir, DEEPEDIT, CLICK_SHAPE, a.device)
    window_net = network(a.model_dir, WHOLEBODY, WINDOW_SHAPE, a.device)
    runs = []

    def run(mode: str, clicks_on: bool, study_on: bool, gate: bool = True) -> None:
        scheduler.set_click_gate(gate)
        runs.append(measure(mode, click_net, window_net, a.seconds, clicks_on, study_on))
        print(json.dumps(runs[-1]), flush=True)
        alone = next((r["windows_per_s"] for r in runs if r["mode"] == "alone" and "windows_per_s" in r), None)
        for r in runs:
            if alone and "windows_per_s" in r and r["mode"] != "alone":
                r["study_throughput_vs_alone"] = round(r["windows_per_s"] / alone, 3)
        a.out.write_text(json.dumps(_record(runs, click_net), indent=2))

    run("alone", True, False)
    run("alone", False, True)
    for _ in range(2):
        run("no_gate", True, True, gate=False)
        run("gate", True, True, gate=True)


if __name__ == "__main__":
    main()
