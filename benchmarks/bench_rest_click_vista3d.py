"""VISTA3D click-to-mask through the REST API of a running rocm_zoo server, as OHIF v3 and 3D Slicer send it.

usage: python benchmarks/bench_rest_click_vista3d.py URL IMAGE_ID TRUTH_NIFTI [--runs 20] [--warmup 5]
                                                  [--prompt-runs 5] [--out FILE]

On a freshly started server (the first click must be the image's first request), in this order:
- OHIF click (`points`, `point_labels`, `label_prompt [3]`, the centre of the spleen in TRUTH_NIFTI): first click,
  then repeated clicks, p50/p90 of the wall time, with the server's per-stage latencies;
- the same click from Slicer (`vista3d_slicer`: `label spleen`, `foreground`; VISTA3D's point mode), repeated;
- class prompt `label_prompt [3]` and "everything" (no prompt), p50/p90 over --prompt-runs.
Writes one JSON record (stdout, and --out), with the server's backend and cache counters.
"""

import argparse
import json
import os
import tempfile
import time

import nibabel as nib
import numpy as np
import requests
from monailabel.client import MONAILabelClient

from rocm_zoo.bench.stats import medians, summarise
from rocm_zoo.engine.masks import central_voxel

VISTA_SPLEEN = 3
SPLEEN_TRUTH = 1  # rocm_zoo phantom truth label


def post(client: MONAILabelClient, model: str, image: str, params: dict) -> tuple[float, dict]:
    """One request through MONAI Label's own client (the mask comes back as a file); (wall ms, server latencies)."""
    body = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "bench", **params}
    t = time.perf_counter()
    result, out = client.infer(model, image, body)
    wall = (time.perf_counter() - t) * 1000
    if result and os.path.exists(result):
        os.remove(result)
    return wall, {k: v for k, v in out["latencies"].items() if isinstance(v, (int, float))}


def series(client: MONAILabelClient, model: str, image: str, params: dict, runs: int, warmup: int) -> dict:
    walls, stages = [], []
    for i in range(warmup + runs):
        wall, lat = post(client, model, image, params)
        if i >= warmup:
            walls.append(wall)
            stages.append(lat)
    out = {**summarise(walls, unit="ms", digits=1), "runs": runs, "warmup": warmup}
    if stages and stages[0]:
        out["stage_p50_s"] = medians(stages)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url"), ap.add_argument("image"), ap.add_argument("truth")
    ap.add_argument("--runs", type=int, default=20), ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--prompt-runs", type=int, default=5), ap.add_argument("--out")
    a = ap.parse_args()
    click = central_voxel(np.asarray(nib.load(a.truth).dataobj) == SPLEEN_TRUTH)
    ohif = {"points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]}
    slicer = {"label": "spleen", "foreground": [click], "background": []}

    client = MONAILabelClient(a.url, tmpdir=tempfile.mkdtemp(prefix="bench_vista3d_"))
    wall, lat = post(client, "vista3d", a.image, ohif)
    record = {
        "image": a.image, "click": click,
        "ohif_first_click": {"wall_ms": round(wall, 1), "latencies_s": lat},
        "ohif_repeated_click": series(client, "vista3d", a.image, ohif, a.runs, a.warmup),
        "slicer_repeated_click": series(client, "vista3d_slicer", a.image, slicer, a.runs, a.warmup),
        "class_prompt_3": series(client, "vista3d", a.image, {"label_prompt": [VISTA_SPLEEN]}, a.prompt_runs, 1),
        "everything": series(client, "vista3d", a.image, {}, a.prompt_runs, 1),
    }
    info = requests.get(f"{a.url}/info/").json()
    model = info["models"]["vista3d"]
    record["server"] = {
        "backend": info.get("rocm_zoo", {}).get("backend"),
        **{k: model.get(k) for k in ("device", "device_name", "dtype", "memory_format", "compile_mode",
                                     "compiled_graphs", "image_cache", "embedding_cache")},
    }
    text = json.dumps(record, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
