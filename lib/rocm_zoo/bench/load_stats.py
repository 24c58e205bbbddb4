"""The requests of a `rocm-zoo bench-load` phase, summarised: outcome of each, per series (a kind of request: "deepedit
click", "GET /info/", ...) the count of each outcome, p50/p90/p99 and throughput; ratios against the baseline (each
class alone); the issue's targets, checked.

Outcomes: `ok` (2xx where one was expected), `intended_4xx` (a 4xx to a request meant to be refused), `not_available`
(404 from a route that may not exist, e.g. /health/* on an older server), `overload` (503 or 504: the server shed
load or missed a deadline; counted apart from errors) and `error` (anything else: other 5xx, no answer, a 4xx not
intended, a 2xx to a bad request). Latency percentiles are over the requests answered as expected (ok and
intended_4xx); throughput counts those completed inside the phase's window, per second of it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from rocm_zoo.bench.load_plan import AUTOMATIC_MODEL
from rocm_zoo.bench.stats import percentile, summarise

OUTCOMES = ("ok", "intended_4xx", "not_available", "overload", "error")
ANSWERED = ("ok", "intended_4xx")
QUANTILES = (50, 90, 99)
TIMELINE_BUCKETS = 200  # at most, per series; at least 1 s each


def outcome(sample: dict) -> str:
    status, expect = int(sample.get("status") or 0), sample.get("expect", "ok")
    if status in (503, 504):
        return "overload"
    if expect == "4xx":
        return "intended_4xx" if 400 <= status < 500 else "error"
    if 200 <= status < 300:
        return "ok"
    if expect == "ok_or_404" and status == 404:
        return "not_available"
    return "error"


def read_samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _by_series(samples: Iterable[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        out[s["name"]].append(s)
    return dict(sorted(out.items()))


def summarise_series(samples: Sequence[dict], start: float, duration_s: float) -> dict[str, Any]:
    """One series' requests: outcome counts, latency percentiles (ms) and throughput (per s of the window)."""
    kinds = Counter(outcome(s) for s in samples)
    answered = [s for s in samples if outcome(s) in ANSWERED]
    ms = [s["ms"] for s in answered]
    end = start + duration_s
    inside = sum(1 for s in answered if s["t"] + s["ms"] / 1000 <= end)
    out: dict[str, Any] = {"user": samples[0].get("user"), "requests": len(samples),
                           **{k: kinds.get(k, 0) for k in OUTCOMES}}
    if ms:
        out.update(summarise(ms, QUANTILES, unit="ms", digits=1))
        out["max_ms"] = round(max(ms), 1)
    out["throughput_per_s"] = round(inside / duration_s, 4)
    problems = Counter(f"{s['status']} {s.get('error') or ''}".strip() for s in samples
                       if outcome(s) in ("error", "overload"))
    if problems:
        out["problems"] = dict(problems.most_common(3))
    return out


def timeline(samples: Sequence[dict], start: float, duration_s: float) -> list[list[float]]:
    """[bucket start s, requests, p50 ms, max ms, errors] per time bucket (by request start) that has requests."""
    width = max(1.0, duration_s / TIMELINE_BUCKETS)
    buckets: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        buckets[int(max(0.0, s["t"] - start) // width)].append(s)
    rows = []
    for i, group in sorted(buckets.items()):
        ms = [s["ms"] for s in group if outcome(s) in ANSWERED]
        errors = sum(1 for s in group if outcome(s) in ("error", "overload"))
        rows.append([round(i * width, 2), len(group), round(percentile(ms, 50), 1) if ms else None,
                     round(max(ms), 1) if ms else None, errors])
    return rows


def summarise_phase(samples: Sequence[dict], start: float, duration_s: float) -> dict[str, Any]:
    series = _by_series(samples)
    totals = Counter(outcome(s) for s in samples)
    return {
        "requests": len(samples), **{k: totals.get(k, 0) for k in OUTCOMES},
        "series": {name: summarise_series(rows, start, duration_s) for name, rows in series.items()},
        "timeline": {name: timeline(rows, start, duration_s) for name, rows in series.items()},
    }


def ratios(phases: dict[str, dict], mixed: str = "mixed") -> dict[str, dict[str, float]]:
    """Per series of the mixed phase that also ran alone: its p50/p90/p99 and throughput under the mix divided by
    the same alone (latency > 1 and throughput < 1: the mix slowed it)."""
    load = phases[mixed]["series"]
    out = {}
    for name, phase in phases.items():
        if name == mixed:
            continue
        for series, alone in phase["series"].items():
            under = load.get(series)
            if under is None:
                continue
            r = {}
            for key in [f"p{q}_ms" for q in QUANTILES] + ["throughput_per_s"]:
                if alone.get(key) and under.get(key) is not None:
                    r[key] = round(under[key] / alone[key], 3)
            if r:
                out[series] = r
    return out


@dataclass(frozen=True)
class Target:
    series: str  # a series of the mixed phase; "" for all of them
    metric: str  # a key of its summary, or "throughput_ratio" (under load / alone), or "errors"
    op: str  # "<=" or ">="
    value: float

    def describe(self) -> str:
        return f"{self.series or 'all requests'} {self.metric} {self.op} {self.value:g}"


# issue 14's targets for the mixed load on one H200 (2 DeepEdit + 1 VISTA3D clinicians, 1 s think time, wholeBody_ct
# back to back, a batch over the datastore).
TARGETS = (
    Target("deepedit click", "p90_ms", "<=", 150),
    Target("vista3d click", "p90_ms", "<=", 300),
    Target("GET /info/", "p99_ms", "<=", 50),
    Target("GET /health/live", "p99_ms", "<=", 50),
    Target("GET /health/ready", "p99_ms", "<=", 50),
    Target(f"automatic {AUTOMATIC_MODEL}", "throughput_ratio", ">=", 0.7),
    Target("", "errors", "<=", 0),
)


def check_targets(record: dict, targets: Sequence[Target] = TARGETS) -> list[dict[str, Any]]:
    """Each target with the run's value and whether it is met (None: this run did not measure it)."""
    mixed = record["phases"].get("mixed", {})
    out = []
    for t in targets:
        if t.metric == "errors":
            value = mixed.get("error")
        elif t.metric == "throughput_ratio":
            value = record.get("ratios", {}).get(t.series, {}).get("throughput_per_s")
        else:
            value = mixed.get("series", {}).get(t.series, {}).get(t.metric)
        met = None if value is None else (value <= t.value if t.op == "<=" else value >= t.value)
        out.append({"target": t.describe(), "value": value, "met": met})
    return out
