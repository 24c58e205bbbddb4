"""What the audit trail costs a click (issue 34): DeepEdit clicks through the REST API, as 3D Slicer sends them, on a
server started here twice, with `--conf audit true` and `--conf audit false`, each time alone and while a second
client saves labels as fast as it can (each save is an audit entry, fsynced). Loopback only; stops by itself.

usage: python benchmarks/bench_audit_cost.py [--studies sample-data/studies] [--truth sample-data/truth]
                                             [--image phantom_test0] [--clicks 30] [--off-first] [--out FILE]
Run from a checkout after `rocm-zoo sample` (the tiny sample bundles); prints and writes JSON with p50/p90 per case.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import requests

from rocm_zoo.bench.stats import summarise
from rocm_zoo.engine.masks import central_voxel


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(studies: Path, audit: bool, log: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", "apps/rocm_zoo", "--studies",
           str(studies), "--conf", "models", "spleen_deepedit", "--conf", "audit", str(audit).lower(), "--host",
           "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            if requests.get(f"{url}/health/ready", timeout=5).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {log}")
        time.sleep(2)
    proc.kill()
    raise SystemExit(f"server not ready in 15 min: see {log}")


def _clicks(url: str, image: str, click: list[int], count: int) -> list[float]:
    params = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "bench", "spleen": [click],
              "background": []}
    walls = []
    for i in range(count + 3):  # 3 warm-ups
        t = time.perf_counter()
        r = requests.post(f"{url}/infer/spleen_deepedit", params={"image": image},
                          data={"params": json.dumps(params)}, timeout=300)
        r.raise_for_status()
        if i >= 3:
            walls.append((time.perf_counter() - t) * 1000)
    return walls


def _saving(url: str, image: str, label: bytes, stop: threading.Event, saved: list[int]) -> None:
    while not stop.is_set():
        r = requests.put(f"{url}/datastore/label", params={"image": image, "tag": "bench-audit"},
                         files={"label": ("l.nii.gz", label)}, timeout=300)
        r.raise_for_status()
        saved[0] += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", default="sample-data/studies"), ap.add_argument("--truth", default="sample-data/truth")
    ap.add_argument("--image", default="phantom_test0"), ap.add_argument("--clicks", type=int, default=30)
    ap.add_argument("--off-first", action="store_true", help="start the server without the trail first (order check)")
    ap.add_argument("--out")
    a = ap.parse_args()
    truth = nib.load(str(Path(a.truth) / f"{a.image}.nii.gz"))
    click = [int(v) for v in central_voxel(np.asarray(truth.dataobj) == 1)]
    label = (Path(a.truth) / f"{a.image}.nii.gz").read_bytes()
    record = {"clicks": a.clicks, "image": a.image, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        for audit in (False, True) if a.off_first else (True, False):
            studies = Path(tmp) / f"studies-{audit}"
            studies.mkdir()
            shutil.copy(Path(a.studies) / f"{a.image}.nii.gz", studies)
            proc, url = _start(studies, audit, Path(tmp) / f"server-{audit}.log")
            try:
                alone = _clicks(url, a.image, click, a.clicks)
                stop, saved = threading.Event(), [0]
                saver = threading.Thread(target=_saving, args=(url, a.image, label, stop, saved))
                saver.start()
                t = time.perf_counter()
                busy = _clicks(url, a.image, click, a.clicks)
                seconds = time.perf_counter() - t
                stop.set()
                saver.join()
                entries = len(requests.get(f"{url}/audit/", timeout=60).json().get("entries", [])) if audit else 0
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
            key = "audit on" if audit else "audit off"
            record["cases"][key] = {"clicks alone": summarise(alone, unit="ms", digits=1),
                                    "clicks while saving": summarise(busy, unit="ms", digits=1),
                                    "saves per second": round(saved[0] / seconds, 2), "trail entries": entries}
            print(key, json.dumps(record["cases"][key]), flush=True)
    record["machine"] = {"cpus": os.cpu_count()}
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
