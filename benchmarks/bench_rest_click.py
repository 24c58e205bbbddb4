"""Click-to-mask through the REST API of a running rocm_zoo server, as 3D Slicer sends it.

usage: python benchmarks/bench_rest_click.py URL IMAGE_ID TRUTH_NIFTI [--runs 20] [--warmup 5] [--out FILE]
Clicks the centre of the spleen in TRUTH_NIFTI; first click and repeated clicks, wall time p50/p90 and the
server's per-stage latencies.
"""

import argparse
import json
import time

import nibabel as nib
import numpy as np
from monailabel.client import MONAILabelClient

from rocm_zoo.bench.stats import medians, summarise
from rocm_zoo.engine.masks import central_voxel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url"), ap.add_argument("image"), ap.add_argument("truth")
    ap.add_argument("--runs", type=int, default=20), ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--model", default="spleen_deepedit"), ap.add_argument("--out")
    a = ap.parse_args()
    click = central_voxel(np.asarray(nib.load(a.truth).dataobj) == 1)
    params = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "bench", "spleen": [click],
              "background": []}
    client = MONAILabelClient(a.url)
    walls, stages = [], []
    for i in range(1 + a.warmup + a.runs):
        t = time.perf_counter()
        _, out = client.infer(a.model, a.image, params)
        wall = (time.perf_counter() - t) * 1000
        if i == 0:
            first = {"wall_ms": round(wall, 1), "latencies_s": out["latencies"]}
        elif i > a.warmup:
            walls.append(wall)
            stages.append({k: v for k, v in out["latencies"].items() if k != "transform"})
    record = {
        "first_click": first,
        "repeated_wall_ms": summarise(walls, digits=1),
        "repeated_stage_p50_s": medians(stages),
        "runs": a.runs, "warmup": a.warmup, "image": a.image,
    }
    print(json.dumps(record, indent=2))
    if a.out:
        open(a.out, "w").write(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
