"""Why a VISTA3D click slows down under the mixed load: the device, or the interpreter?

A four-point OHIF click (bench-load's) runs some 2,600 small operations and 260 waits for the device (torch.profiler,
docs/benchmarks.md). Each operation hands the Python interpreter's lock (GIL) back and takes it again; while another
thread runs Python, taking it back can wait up to the interpreter's switch interval (5 ms by default). This probe
runs the click in the server's own code without HTTP (the rocm_zoo app built in this process, warm, `app.infer` as a
clinician's click) beside:
  nothing         the click alone
  wholebody       wholeBody_ct requests back to back on another study (automatic work: host `pre` and `post`, GPU
                  window batches), as bench-load's automatic client sends them
  python          a thread that only runs Python (no device work): the interpreter's share alone
and, for each, under several switch intervals (`sys.setswitchinterval`). wholeBody_ct alone gives the baseline of its
throughput. Per mode: the click's p50/p90/max, its server stages (pre, infer, post), and wholeBody_ct requests/s.
All of it twice: the point head's transformer eager (about half of the click's operations), then compiled
(torch.compile, shapes dynamic after the second point count; warmed with 1, 2 and 4 points first).

  python benchmarks/probe_vista3d_beside.py STUDIES TRUTH_NIFTI OUT_JSON [--seconds 15] [--intervals-ms 5,1,0.25]

STUDIES holds phantom_spleen10 (the click's) and spleen10_auto (wholeBody_ct's); TRUTH_NIFTI is the click's truth.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from probe_click_beside_batch import run_for
from profile_vista3d_click import SPLEEN_TRUTH, VISTA_SPLEEN, one, point_transformer, warm_app
from rocm_zoo.bench.load import organ_clicks
from rocm_zoo.bench.network import versions
from rocm_zoo.bench.stats import medians, summarise
from rocm_zoo.engine.scheduler import Priority, Work, working_as

CLICK_IMAGE = "phantom_spleen10"
WHOLEBODY_IMAGE = "spleen10_auto"
THINK_S = 0.2


def measure(app, click: dict | None, wholebody: dict | None, python_thread: bool, seconds: float) -> dict:
    stop = threading.Event()
    click_ms: list[float] = []
    stages: list[dict] = []
    wholebody_done = [0]

    def clicks() -> None:
        while not stop.is_set():
            wall, latencies = one(app, click)
            click_ms.append(wall * 1000)
            stages.append({k: v for k, v in latencies.items() if k in ("pre", "infer", "post")})
            time.sleep(THINK_S)

    def wholebody_requests() -> None:
        with working_as(Work(Priority.AUTOMATIC, "automatic", what="wholeBody_ct")):
            while not stop.is_set():
                result = app.infer(wholebody)
                Path(result["label"]).unlink(missing_ok=True)
                wholebody_done[0] += 1

    def python_only() -> None:
        while not stop.is_set():
            total = 0
            for i in range(1000):
                total += i

    targets = ((clicks, click is not None), (wholebody_requests, wholebody is not None), (python_only, python_thread))
    elapsed = run_for([f for f, on in targets if on], stop, seconds)
    record: dict = {"seconds": round(elapsed, 1)}
    if click_ms:
        record["click"] = {"clicks": len(click_ms), **summarise(click_ms, (50, 90), unit="ms", digits=1),
                           "max_ms": round(max(click_ms), 1), "stages_p50_s": medians(stages, digits=3)}
    if wholebody is not None:
        record["wholebody_per_s"] = round(wholebody_done[0] / elapsed, 3)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("studies"), p.add_argument("truth"), p.add_argument("out", type=Path)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--intervals-ms", default="5,1,0.25", help="switch intervals to run every mode under")
    a = p.parse_args()
    intervals = [float(v) for v in a.intervals_ms.split(",")]
    points = organ_clicks(np.asarray(nib.load(a.truth).dataobj), SPLEEN_TRUTH, count=4)
    common = {"result_extension": ".nrrd", "result_dtype": "uint8"}
    click = {"model": "vista3d", "image": CLICK_IMAGE, "points": points, "point_labels": [1] * len(points),
             "label_prompt": [VISTA_SPLEEN], "client_id": "clinician", **common}
    wholebody = {"model": "wholeBody_ct", "image": WHOLEBODY_IMAGE, "client_id": "automatic", **common}

    started = time.perf_counter()
    app = warm_app(a.studies, "vista3d,wholeBody_ct")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record: dict = {"versions": versions(device), "app_ready_s": round(time.perf_counter() - started, 1),
                    "default_switch_interval_ms": sys.getswitchinterval() * 1000, "think_s": THINK_S, "runs": []}
    for _ in range(2):  # the first answers of each (caches filled, allocator warm) are not timed
        one(app, click)
        with working_as(Work(Priority.AUTOMATIC, "automatic", what="wholeBody_ct")):
            Path(app.infer(wholebody)["label"]).unlink(missing_ok=True)
    points_of = {n: {**click, "points": points[:n], "point_labels": [1] * n} for n in (1, 2)}
    modes = (("click alone", True, False, False), ("wholeBody_ct alone", False, True, False),
             ("click beside wholeBody_ct", True, True, False), ("click beside a Python thread", True, False, True))
    transformer = point_transformer(app)
    compiled_call = transformer._compiled_call_impl  # nn.Module.compile's; None where the overlay leaves it eager
    record["overlay_compiles_transformer"] = compiled_call is not None
    answers: dict[str, list] = {}
    for variant in ("eager", "compiled"):
        if variant == "eager":
            transformer._compiled_call_impl = None
        else:
            transformer._compiled_call_impl = compiled_call or torch.compile(transformer._call_impl, dynamic=None)
            started = time.perf_counter()
            for warm in (points_of[1], points_of[2], click):
                one(app, warm)
            record["transformer_warm_s"] = round(time.perf_counter() - started, 1)
        answers[variant] = []
        one(app, click, answers[variant])
        if variant == "compiled":  # the same click's mask, voxel by voxel (bf16 rounding may move a few)
            record["voxels_unlike_eager"] = int((answers["compiled"][0] != answers["eager"][0]).sum())
        for interval in intervals:
            sys.setswitchinterval(interval / 1000)
            for mode, clicks_on, wholebody_on, python_on in modes:
                run = {"mode": mode, "point_transformer": variant, "switch_interval_ms": interval,
                       **measure(app, click if clicks_on else None, wholebody if wholebody_on else None, python_on,
                                 a.seconds)}
                record["runs"].append(run)
                print(json.dumps(run), flush=True)
                a.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
