"""A newcomer's first minutes: a server started on the sample data with an empty compile cache, clicked at once.

usage: python benchmarks/bench_cold_start.py [--app apps/rocm_zoo] [--studies sample-data/studies]
                                             [--truth sample-data/truth] [--image phantom_test0] [--models all]
                                             [--until ready|all] [--out FILE]
Seconds from the start until: the server answers (`/health/live`), the first DeepEdit click and the first VISTA3D
click are answered (sent the moment it answers, at the spleen's centre, as Slicer sends them), `/health/ready`, and
(`--until all`) every model is compiled (a model that fails to warm ends the run with its reason). Prints JSON; the
models' warm-up seconds included.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import requests
from monailabel.client import MONAILabelClient

from rocm_zoo.bench.server_process import monailabel_server, wait_warm
from rocm_zoo.engine.masks import central_voxel

CLICKS = {  # model -> how Slicer sends one foreground click on the spleen
    "spleen_deepedit": lambda click: {"label": "spleen", "spleen": [click], "background": []},
    "vista3d_slicer": lambda click: {"label": "spleen", "foreground": [click], "background": []},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="apps/rocm_zoo"), ap.add_argument("--studies", default="sample-data/studies")
    ap.add_argument("--truth", default="sample-data/truth"), ap.add_argument("--image", default="phantom_test0")
    ap.add_argument("--models", default="all"), ap.add_argument("--until", choices=("ready", "all"), default="all")
    ap.add_argument("--out")
    a = ap.parse_args()
    click = central_voxel(np.asarray(nib.load(Path(a.truth) / f"{a.image}.nii.gz").dataobj) == 1)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cold_start_") as work:
        start = time.perf_counter()

        def mark(what: str) -> None:
            seconds[what] = round(time.perf_counter() - start, 1)
            print(f"{what}: {seconds[what]} s", file=sys.stderr, flush=True)

        # the server runs in a scratch folder: paths given relative to here are made absolute
        with monailabel_server(Path(a.app).resolve(), str(Path(a.studies).resolve()), a.models,
                               Path(work) / "server.log", Path(work), 1800,
                               {"TORCHINDUCTOR_CACHE_DIR": str(Path(work) / "inductor")}, ready=False) as url:
            mark("answers")
            for model, params in CLICKS.items():
                with tempfile.TemporaryDirectory() as tmp:
                    MONAILabelClient(url, tmpdir=tmp).infer(model, a.image, {"result_extension": ".nrrd",
                                                                             **params(click)})
                mark(f"first {model} click")
            while requests.get(f"{url}/health/ready", timeout=30).status_code != 200:
                time.sleep(1)
            mark("ready")
            warm = requests.get(f"{url}/health/ready", timeout=30).json()["models"]
            if a.until == "all":
                warm = wait_warm(url, 3600)
                mark("all compiled")
    record = {"seconds_from_start": seconds, "models": warm, "cores": len(os.sched_getaffinity(0))}
    text = json.dumps(record, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
