"""Where a repeated VISTA3D click spends its time, in the server's own code without HTTP: the rocm_zoo app built in
this process (as `monailabel start_server` builds it, warmed), then `app.infer` with the requests OHIF and Slicer send.

usage: python benchmarks/profile_vista3d_click.py STUDIES IMAGE_ID TRUTH_NIFTI OUT_DIR [--runs 20] [--warmup 5]

Three variants in one run, each timed over the same clicks (p50/p90 of `app.infer`, and of the network forwards in it
with a device sync around each):
- monai_window: MONAI's point window inferer (stitches on the host) and VISTA3D's `torch.cuda.empty_cache()` per
  forward, everything else as rocm_zoo has it;
- rocm_zoo: the windows stitched on the device (`rocm_zoo.vista3d.window`), the allocator's cache kept;
- rocm_zoo+point_head: the same, with the point head's two convolution stacks (`feat_downsample`,
  `output_upscaling`; fixed shapes for every click) compiled in place (their compile falls in the warm-up clicks).
Then a torch.profiler run of rocm_zoo's clicks: OUT_DIR/profile_{ohif,slicer}.txt (operators by device time and by
host time) and OUT_DIR/trace_ohif.json.gz (one click, for chrome://tracing / Perfetto). OUT_DIR/profile_click.json
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
import numpy as np
import torch
from monai.apps.vista3d import inferer as monai_inferer

from rocm_zoo.vista3d import predictor as vista_predictor
from rocm_zoo.vista3d import reroutes
from rocm_zoo.vista3d import window as vista_window
from rocm_zoo.bench.network import versions
from rocm_zoo.bench.stats import medians, summarise
from rocm_zoo.engine.masks import central_voxel

REPO = Path(__file__).resolve().parents[1]
VISTA_SPLEEN = 3
SPLEEN_TRUTH = 1


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


@contextlib.contextmanager
def monai_variant():
    """MONAI's own click path: its host-stitching window inferer and VISTA3D's cache emptying."""
    route, kept = vista_window.route_inferer, reroutes.allocator_cache_kept

    def monai_route(inferer):  # `install` runs before each click: this puts MONAI's inferer back each time
        type(inferer).__call__.__globals__["point_based_window_inferer"] = monai_inferer.point_based_window_inferer

    vista_window.route_inferer, reroutes.allocator_cache_kept = monai_route, contextlib.nullcontext
    try:
        yield
    finally:
        vista_window.route_inferer, reroutes.allocator_cache_kept = route, kept


@contextlib.contextmanager
def point_head_compiled(app):
    """The point head's fixed-shape convolution stacks compiled, on every pooled VISTA3D network of the app."""
    for task in app._infers.values():
        net = task.pool.peek(task.network_spec())
        for name in POINT_HEAD_STACKS:
            module = net.eager.point_head.get_submodule(name)
            if not getattr(module, "_compiled_call_impl", None):
                module.compile(dynamic=False)
    yield


POINT_HEAD_STACKS = ("feat_downsample", "output_upscaling")


def one(app, request: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    result = app.infer(request)
    wall = time.perf_counter() - t
    Path(result["label"]).unlink(missing_ok=True)
    return wall, result.get("params", {}).get("latencies", {})


def series(app, request: dict, runs: int, warmup: int) -> dict:
    walls, forwards, stages = [], [], []
    for i in range(warmup + runs):
        with ForwardTimer() as timer:
            wall, lat = one(app, request)
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
    if name == "ohif":
        with torch.profiler.profile(activities=activities) as one_click:
            one(app, request)
        trace = out / "trace_ohif.json"
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
    click = central_voxel(np.asarray(nib.load(a.truth).dataobj) == SPLEEN_TRUTH)
    common = {"image": a.image, "result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "profile"}
    requests = {
        "ohif": {"model": "vista3d", "points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN], **common},
        "slicer": {"model": "vista3d_slicer", "label": "spleen", "foreground": [click], "background": [], **common},
    }

    sys.path.insert(0, str(REPO / "apps" / "rocm_zoo"))
    from main import MyApp  # the app's main.py, as MONAI Label loads it

    t = time.perf_counter()
    app = MyApp(str(REPO / "apps" / "rocm_zoo"), a.studies, {"models": "vista3d"})
    app.on_init_complete()  # warms (compiles) every model, as the server does before answering
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record = {"versions": versions(device), "click": click, "app_ready_s": round(time.perf_counter() - t, 1)}
    t = time.perf_counter()
    one(app, requests["ohif"])
    record["first_click_ms"] = round((time.perf_counter() - t) * 1000, 1)
    variants = (("monai_window", monai_variant), ("rocm_zoo", contextlib.nullcontext),
                ("rocm_zoo+point_head", lambda: point_head_compiled(app)))
    for variant, context in variants:
        with context():
            record[variant] = {name: series(app, r, a.runs, a.warmup) for name, r in requests.items()}
        print(variant, json.dumps(record[variant]), flush=True)
    for name, r in requests.items():
        profile(app, r, out, name)
    (out / "profile_click.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
