"""The server process's resources over time, for load and soak tests: resident set size (RSS) of the process and of
its children, the GPU memory the process holds, its open files, and the size of its temporary folder when known.

The process is the one bench-load started, or the one listening on the URL's port (found through psutil; loopback
only, so it is on this machine). GPU memory per process comes from `nvidia-smi` (what the process holds on the
device: PyTorch's caching allocator's reserve plus the CUDA context); where there is no such tool or no GPU, it is
left out. Growth compares the median of the first tenth of the samples with that of the last tenth.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from rocm_zoo.bench.stats import percentile

MB = 2**20
# What a sample holds, by key, as the report names it (a key may be missing: no GPU, no known temporary folder).
RESOURCES = {"rss_mb": "RSS MiB", "rss_tree_mb": "RSS with children MiB", "gpu_mb": "GPU MiB",
             "open_files": "open files", "temp_mb": "temporary folder MiB"}


def listening_pid(url: str) -> int | None:
    """The pid of the process listening on the URL's port on this machine, if it can be seen."""
    port = urlsplit(url).port or (443 if url.startswith("https") else 80)
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.AccessDenied, OSError):
        pass
    return None


def gpu_memory_mb(pids: set[int]) -> float | None:
    """MiB of GPU memory the processes hold, summed over GPUs (nvidia-smi); None where that cannot be read."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = [float(mem) for pid, mem in (line.split(",") for line in out.splitlines() if line.count(",") == 1)
            if pid.strip().isdigit() and int(pid) in pids and mem.strip().replace(".", "", 1).isdigit()]
    return sum(used) if used else None


def folder_mb(folder: Path) -> float:
    """MiB of the files under `folder` (files that vanish while it is walked are skipped)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / MB


def sample(proc: psutil.Process, temp_dir: Path | None = None) -> dict[str, Any]:
    """One sample: time, RSS of the process and of it with its children (MiB), its open files, GPU memory (MiB) when
    readable, and the size of its temporary folder (MiB) when given."""
    children = proc.children(recursive=True)
    rss = proc.memory_info().rss
    tree = rss
    for c in children:
        try:
            tree += c.memory_info().rss
        except psutil.Error:  # a child that just exited
            pass
    row = {"t": round(time.time(), 3), "rss_mb": round(rss / MB, 1), "rss_tree_mb": round(tree / MB, 1),
           "open_files": proc.num_fds()}
    if temp_dir is not None:
        row["temp_mb"] = round(folder_mb(temp_dir), 2)
    gpu = gpu_memory_mb({proc.pid, *(c.pid for c in children)})
    if gpu is not None:
        row["gpu_mb"] = gpu
    return row


class ResourceSampler:
    """Samples the process every `interval_s` in a thread, from `start()` to `stop()`; `rows` holds the samples,
    each tagged with the phase running then (`phase`, set by the caller); `temp_dir` is the process's temporary
    folder (its TMPDIR), if known."""

    def __init__(self, pid: int, interval_s: float = 1.0, temp_dir: Path | None = None):
        self.proc = psutil.Process(pid)
        self.temp_dir = temp_dir
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []
        self.phase = ""
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-load-resources", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.rows.append({"phase": self.phase, **sample(self.proc, self.temp_dir)})
            except psutil.Error as e:  # the server exited: the benchmark reports it; sampling stops
                self.error = f"{type(e).__name__}: {e}"
                return
            self._stop.wait(self.interval_s)

    def start(self) -> "ResourceSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def growth(rows: list[dict], key: str) -> dict[str, float] | None:
    """Start (median of the first tenth of the samples), end (of the last tenth), max, and growth in % of start."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if len(values) < 2:
        return None
    tenth = max(1, len(values) // 10)
    start, end = percentile(values[:tenth], 50), percentile(values[-tenth:], 50)
    return {"start": round(start, 1), "end": round(end, 1), "max": round(max(values), 1),
            "growth_pct": round(100 * (end - start) / start, 2) if start else None, "samples": len(values)}
