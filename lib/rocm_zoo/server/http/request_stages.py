"""Where one request's time goes on the DICOMweb path: fetch series, convert, infer, encode SEG, store.

The datastore times its own stages with `timed(stage)`; the app opens a `recording()` around each request, adds the
task's own latencies (pre / infer / invert / post / write, what MONAI Label measures) and writes one log line a person
can read and `parse_line` can read back (the OHIF benchmark does, from the server's log). Stages add up: a request
that looks a series up twice counts both look-ups. A stage that did not run is 0 (a cached series is neither fetched
nor converted; a label that is not saved is neither encoded nor stored).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

STAGES = ("fetch_series", "convert", "infer", "encode_seg", "store")
TASK_LATENCIES = ("pre", "infer", "invert", "post", "write")  # MONAI Label's keys, inside the `infer` stage
LOG_PREFIX = "request stages:"
logger = logging.getLogger(__name__)

_current: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("rocm_zoo_stages", default=None)


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Collects the stages timed in this thread (and its copied contexts) until the block ends."""
    stages: dict[str, float] = {}
    token = _current.set(stages)
    try:
        yield stages
    finally:
        _current.reset(token)


def add(stage: str, seconds: float) -> None:
    stages = _current.get()
    if stages is not None:
        stages[stage] = stages.get(stage, 0.0) + seconds


@contextmanager
def timed(stage: str) -> Iterator[None]:
    """Adds the block's wall time to `stage` of the request being recorded (nothing outside a recording)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(stage, time.perf_counter() - start)


def summary(stages: Mapping[str, float], task_latencies: Mapping[str, Any] | None, request_s: float) -> dict:
    """Seconds per stage (all five), the task's own split of `infer`, and the whole request as the server saw it."""
    task = {k: float(v) for k, v in (task_latencies or {}).items() if k in TASK_LATENCIES + ("total",)
            and isinstance(v, (int, float))}
    out = {stage: round(float(stages.get(stage, 0.0)), 4) for stage in STAGES}
    out["infer"] = round(task.get("total", float(stages.get("infer", 0.0))), 4)
    out["request"] = round(request_s, 4)
    out["task"] = {k: task[k] for k in TASK_LATENCIES if k in task}
    return out


def format_line(model: str, image: str, s: Mapping[str, Any]) -> str:
    """`request stages: wholeBody_ct 1.2.3 fetch_series=0.031 convert=0.000 infer=1.240 encode_seg=0.000 store=0.000
    request=1.290 s (task: pre=0.31 infer=0.80 invert=0.00 post=0.05 write=0.08)`."""
    main = " ".join(f"{k}={s[k]:.3f}" for k in STAGES + ("request",))
    task = " ".join(f"{k}={v:.2f}" for k, v in s.get("task", {}).items())
    return f"{LOG_PREFIX} {model} {image} {main} s (task: {task})"


_LINE = re.compile(re.escape(LOG_PREFIX) + r" (?P<model>\S+) (?P<image>\S+) (?P<main>[^(]*) s \(task: (?P<task>[^)]*)\)")


def parse_line(line: str) -> dict | None:
    """The stages of one `format_line` line (anywhere in a log line), or None for any other line."""
    m = _LINE.search(line)
    if not m:
        return None
    return {"model": m["model"], "image": m["image"], **_pairs(m["main"]), "task": _pairs(m["task"])}


def _pairs(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (p.split("=", 1) for p in text.split())}


def report(result: Any, stages: Mapping[str, float], request_s: float, model: str, image: str) -> dict:
    """Puts the stages into the response's `latencies` (as `latencies.stages`, next to MONAI Label's own keys; a
    viewer sees them where the response carries params: `output=json` or `all`) and logs the line. Returns them."""
    params = result.get("params") if isinstance(result, dict) else None
    latencies = params.get("latencies") if isinstance(params, dict) else None
    s = summary(stages, latencies if isinstance(latencies, dict) else None, request_s)
    if isinstance(latencies, dict):
        latencies["stages"] = {k: v for k, v in s.items() if k != "task"}
    logger.info("%s", format_line(model, image, s))
    return s
