"""Where a repeated VISTA3D click spends its time, in the server's own code without HTTP: the rocm_zoo app built in
this process (as `monailabel start_server` builds it, warmed), then `app.infer` with the requests OHIF and Slicer send.

usage: python benchmarks/profile_vista3d_click.py STUDIES IMAGE_ID TRUTH_NIFTI OUT_DIR [--runs 20] [--warmup 5]

Requests: OHIF's click with the spleen's class, one point (`ohif`) and four (`ohif4`: OHIF sends all of a segment's
points, as bench-load's clinician does, each point its own window), and Slicer's click. Variants, each timed over the
same requests (p50/p90 of `app.infer`, and of the network forwards in it with a device sync around each):
- before: the click path of 2026-12-04 (cd299f0): regions labelled by spreading the 3x3x3 filter voxel by voxel,
  only the image encoder's output kept per window;
- jumping: regions labelled by pointer jumping (`rocm_zoo.vista3d.components` now), encoder output kept;
- rocm_zoo: that, and the class head's map and the point head's downsampled features kept per window as well.
Each variant's first answer to each request is compared with before's, voxel by voxel (`voxels_unlike_before`).
Then a torch.profiler run of rocm_zoo's clicks: OUT_DIR/profile_{ohif4,slicer}.txt (operators by device time and by
host time) and OUT_DIR/trace_ohif4.json.gz (one click, for chrome://tracing / Perfetto). OUT_DIR/profile_click.json
holds the timings.
"""

import argparse
import contextlib
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import nibabel as nib
import nrrd
import numpy as np
import torch
import torch.nn.functional as F

from rocm_zoo.bench.load import organ_clicks
from rocm_zoo.bench.network import versions
from rocm_zoo.bench.stats import medians, summarise
from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.vista3d import components
from rocm_zoo.vista3d import predictor as vista_predictor

REPO = Path(__file__).resolve().parents[1]
VISTA_SPLEEN = 3
SPLEEN_TRUTH = 1


def warm_app(studies: str, models: str):
    """The rocm_zoo app as `monailabel start_server` builds it (the app's main.py), every model warm (compiled in the
    background, as the server does, and waited for): the first request on it is one on a warm app."""
    sys.path.insert(0, str(REPO / "apps" / "rocm_zoo"))
    from main import MyApp

    app = MyApp(str(REPO / "apps" / "rocm_zoo"), studies, {"models": models})
    app.on_init_complete()
    app.zoo.wait_warm()
    return app


def point_transformer(app) -> torch.nn.Module:
    """VISTA3D's point-head transformer in the app's warm network (compiled by the overlay: `_compiled_call_impl`)."""
    task = app._infers["vista3d"]
    return task.pool.peek(task.network_spec()).eager.point_head.transformer


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class ForwardTimer:
    """Times every VistaPredictor call (the network forwards of a request), device-synced."""

    def __init__(self):
        self.seconds: list[float] = []
        self._call = vista_predictor.VistaPredictor.__call__

    def __enter__(self):
        call = self._call

        def timed(predictor, *args, **kwargs):
            sync()
            t = time.perf_counter()
            out = call(predictor, *args, **kwargs)
            sync()
            self.seconds.append(time.perf_counter() - t)
            return out

        vista_predictor.VistaPredictor.__call__ = timed
        return self

    def __exit__(self, *exc):
        vista_predictor.VistaPredictor.__call__ = self._call


def filter_label_regions(mask: torch.Tensor) -> torch.Tensor:
    """The labelling of cd299f0: the largest start value spread by a 3x3x3 max filter until nothing changes."""
    n = mask.numel()
    dtype = torch.float32 if n <= 2**24 else torch.float64
    m = mask.to(dtype)[None, None]
    values = torch.arange(n, 0, -1, dtype=dtype, device=mask.device).view(m.shape) * m
    while True:
        previous = values
        for _ in range(8):
            values = F.max_pool3d(values, 3, stride=1, padding=1) * m
        if torch.equal(previous, values):
            return values[0, 0]


WINDOW_OUTPUTS_BESIDE_THE_ENCODER = ("class_head", "point_head.feat_downsample")


@contextlib.contextmanager
def variant(app, labelling=None, encoder_only: bool = False):
    """Swaps the region labelling; with `encoder_only`, the submodules kept beside the encoder run every time (their
    wrappers look at a window state no thread sets)."""
    kept_labelling = components.label_regions
    swapped = []
    if labelling is not None:
        components.label_regions = labelling
    if encoder_only:
        for task in app._infers.values():
            net = task.pool.peek(task.network_spec())
            for path in WINDOW_OUTPUTS_BESIDE_THE_ENCODER:
                wrapper = net.eager.get_submodule(path)
                if isinstance(wrapper, vista_predictor.CachingSubmodule) and wrapper not in [w for w, _ in swapped]:
                    swapped.append((wrapper, wrapper.windows))
                    wrapper.windows = vista_predictor.ThreadWindows()
    try:
        yield
    finally:
        components.label_regions = kept_labelling
        for wrapper, windows in swapped:
            wrapper.windows = windows


# As the server's request queue runs a click: without it the request is background work, which neither keeps its
# preprocessed image for the next click nor runs on the interactive stream.
CLICK = Work(Priority.INTERACTIVE, "profile", what="click")


def one(app, request: dict, answers: list | None = None) -> tuple[float, dict]:
    t = time.perf_counter()
    with working_as(CLICK):
        result = app.infer(request)
    wall = time.perf_counter() - t
    if answers is not None:
        answers.append(nrrd.read(result["label"])[0])
    Path(result["label"]).unlink(missing_ok=True)
    return wall, result.get("params", {}).get("latencies", {})


def series(app, request: dict, runs: int, warmup: int, answers: list) -> dict:
    walls, forwards, stages = [], [], []
    for i in range(warmup + runs):
        with ForwardTimer() as timer:
            wall, lat = one(app, request, answers if i == 0 else None)
        if i >= warmup:
            walls.append(wall * 1000)
            forwards.append(sum(timer.seconds) * 1000)
            stages.append({k: v for k, v in lat.items() if isinstance(v, (int, float))})
    return {**summarise(walls, unit="ms", digits=1),
            "forwards_p50_ms": summarise(forwards, (50,), unit="ms", digits=1)["p50_ms"],
            "stage_p50_s": medians(stages, digits=4),
            "runs": runs, "warmup": warmup}


def profile(app, request: dict, out: Path, name: str, runs: int = 3) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(runs):
            one(app, request)
    device_key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages()
    text = (f"# {name}: {runs} clicks\n## by device time\n{table.table(sort_by=device_key, row_limit=35)}\n"
            f"## by host time (self)\n{table.table(sort_by='self_cpu_time_total', row_limit=35)}\n")
    (out / f"profile_{name}.txt").write_text(text)
    if name == "ohif4":
        with torch.profiler.profile(activities=activities) as one_click:
            one(app, request)
        trace = out / "trace_ohif4.json"
        one_click.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("studies"), ap.add_argument("image"), ap.add_argument("truth"), ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=20), ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clicks = organ_clicks(np.asarray(nib.load(a.truth).dataobj), SPLEEN_TRUTH, count=4)
    click = clicks[0]
    common = {"image": a.image, "result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "profile"}
    requests = {
        "ohif": {"model": "vista3d", "points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN], **common},
        "ohif4": {"model": "vista3d", "points": clicks, "point_labels": [1] * len(clicks),
                  "label_prompt": [VISTA_SPLEEN], **common},
        "slicer": {"model": "vista3d_slicer", "label": "spleen", "foreground": [click], "background": [], **common},
    }

    t = time.perf_counter()
    app = warm_app(a.studies, "vista3d")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record = {"versions": versions(device), "clicks": clicks, "app_ready_s": round(time.perf_counter() - t, 1)}
    t = time.perf_counter()
    one(app, requests["ohif"])
    record["first_click_ms"] = round((time.perf_counter() - t) * 1000, 1)
    variants = (("before", lambda: variant(app, filter_label_regions, encoder_only=True)),
                ("jumping", lambda: variant(app, encoder_only=True)),
                ("rocm_zoo", lambda: variant(app)))
    first_answers: dict[str, list] = {}
    for name, context in variants:
        answers: list = []
        with context():
            record[name] = {r: series(app, request, a.runs, a.warmup, answers) for r, request in requests.items()}
        first_answers[name] = answers
        record[name]["voxels_unlike_before"] = {
            r: int((ours != theirs).sum()) for r, ours, theirs in zip(requests, answers, first_answers["before"])}
        print(name, json.dumps(record[name]), flush=True)
    cache = vista_predictor.embedding_cache(app._infers["vista3d"].pool.peek(app._infers["vista3d"].network_spec()))
    record["embedding_cache"] = {"entries": len(cache), "bytes": cache.size_bytes(), "hits": cache.hits,
                                 "misses": cache.misses}
    for name in ("ohif4", "slicer"):
        profile(app, requests[name], out, name)
    (out / "profile_click.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
