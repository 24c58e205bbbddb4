"""Where a bench-load run's requests spent their time on the server: the `request stages:` lines of the server's log,
grouped by bench-load phase (from bench-load's own log), model, and whether a request or a batch study ran them;
p50 / p90 of the request and of each task stage (pre, infer, post, write), in ms (`rocm_zoo.bench.stats.percentile`,
as every record; records before 2026-12-07 took the nearest rank). Needs rocm_zoo importable: the venv, or
PYTHONPATH=lib as the GPU machine's scripts set it.

    python3 benchmarks/load_stages.py RUN/server.log RUN/bench.log      # as benchmarks/device/load-profile.sh writes
"""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

from rocm_zoo.bench.stats import percentile
from rocm_zoo.server.http.request_stages import parse_line

PHASE = re.compile(r"(\S+ \S+),\d+ .*phase '([^']+)'")
THREAD = re.compile(r"\] \[(\S+)\] \[INFO")
TASK_STAGES = ("pre", "infer", "post", "write")


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def stages_by_phase(server_log: Path, bench_log: Path) -> dict[tuple[str, str, str], list[dict]]:
    phases = [(_time(m[1]), m[2]) for m in map(PHASE.search, bench_log.read_text().splitlines()) if m]
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for line in server_log.read_text().splitlines():
        stages = parse_line(line)
        if not stages:
            continue
        at = _time(line[1:20])  # the server log's "[2026-12-04 17:51:01,143]"
        phase = next((name for start, name in reversed(phases) if at >= start), None)
        if phase is None:  # warm-up, before the first phase
            continue
        thread = THREAD.search(line)
        who = "batch" if thread and "batch" in thread[1] else "request"
        rows.setdefault((phase, stages["model"], who), []).append(stages)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = stages_by_phase(Path(argv[0]), Path(argv[1]))
    print("| phase | model | run by | n | request p50 / p90 ms | " + " | ".join(f"{s} p50 / p90" for s in TASK_STAGES)
          + " |")
    print("|---" * (5 + len(TASK_STAGES)) + "|")
    for (phase, model, who), found in sorted(rows.items()):
        if len(found) < 2:  # a request that straddled two phases
            continue
        cells = [f"{percentile([s['request'] for s in found], 50) * 1000:.0f} / "
                 f"{percentile([s['request'] for s in found], 90) * 1000:.0f}"]
        for stage in TASK_STAGES:
            values = [s["task"].get(stage, 0.0) for s in found]
            cells.append(f"{percentile(values, 50) * 1000:.0f} / {percentile(values, 90) * 1000:.0f}")
        print(f"| {phase} | {model} | {who} | {len(found)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
