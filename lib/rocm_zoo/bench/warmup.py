"""`rocm-zoo bench-warmup`: how long a network takes to get warm, cold and from the on-disk compile cache.

Each start is a fresh Python process (as a server restart is) that builds the bundle's network through the pool with
its overlay and warms it at the exact shapes the server warms. The first start has an empty Inductor cache folder
(cold); the later ones reuse it (restart). The JSON record holds each start's seconds.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rocm_zoo.registry import BUNDLES

_CHILD = """
import json, sys, time
from pathlib import Path
start = time.perf_counter()
from rocm_zoo.bench.network import default_overlay
from rocm_zoo.engine.pool import NetworkSpec, build_network
from rocm_zoo.registry import BUNDLES
bundle_dir, device, shapes = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
entry = BUNDLES[bundle_dir.name]
imported = time.perf_counter()
net = build_network(NetworkSpec(bundle_dir, entry.config, entry.weights, (default_overlay(bundle_dir.name),), device))
built = time.perf_counter()
net.warm(shapes)
print(json.dumps({"import_s": imported - start, "build_s": built - imported, "warm_s": net.warm_seconds,
                  "total_s": time.perf_counter() - start, **net.info()}))
"""


def run_warmup_bench(bundle_dir: Path, shapes: list[list[int]], out_dir: Path, device: str = "auto",
                     restarts: int = 2, cache_dir: Path | None = None, command: str = "") -> dict:
    bundle_dir = Path(bundle_dir).resolve()
    if bundle_dir.name not in BUNDLES:
        raise SystemExit(f"{bundle_dir.name} is not a bundle rocm_zoo knows: {', '.join(BUNDLES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir or tempfile.mkdtemp(prefix="rocm_zoo_inductor_"))
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"--cache-dir {cache} is not empty: the first start must be cold")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    record = {"bundle": bundle_dir.name, "device": device, "shapes": shapes, "cache_dir": str(cache),
              "command": command, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "starts": []}
    for i in range(1 + restarts):
        t = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", _CHILD, str(bundle_dir), device, json.dumps(shapes)],
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"start {i} failed:\n{run.stderr[-3000:]}")
        start = json.loads(run.stdout.strip().splitlines()[-1])
        start["kind"] = "cold" if i == 0 else "restart"
        start["process_s"] = round(time.perf_counter() - t, 2)
        record["starts"].append(start)
        print(f"{start['kind']}: network warm {start['warm_s']:.1f} s, process {start['process_s']:.1f} s", flush=True)
    cold = record["starts"][0]["warm_s"]
    record["restart_speedup"] = round(cold / min(s["warm_s"] for s in record["starts"][1:]), 2) if restarts else None
    (out_dir / f"warmup-{bundle_dir.name}.json").write_text(json.dumps(record, indent=2))
    return record
