"""`rocm-zoo bench-report`: the current benchmark table and chart, made from the JSON records.

An index (docs/benchmarks/current.json) names, for each user-facing figure, the record that holds today's value and
the one that holds its baseline, with the path of each number inside its record, the target and its source, the
device and the date. This module reads those numbers, writes the table between two markers in docs/benchmarks.md and
draws the chart (baseline, today and target per row). Nothing in the table is typed by hand: a number changes by
pointing the index at a newer record.

A reference to a number is either `{"record": "<dir>/<file>.json", "path": [...]}`, where each path step is a key, a
list index, or an object of key/value pairs that picks the one list element matching them all; or, for a figure that
exists only in prose, `{"prose": "<heading in benchmarks.md>", "value": N}`, shown as such in the table.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rocm_zoo.errors import RocmZooError

BEGIN = "<!-- current-table:begin (made by `rocm-zoo bench-report` from docs/benchmarks/current.json; edit that) -->"
END = "<!-- current-table:end -->"
UNITS = {"ms": 1.0, "s": 1000.0}


class ReportError(RocmZooError, ValueError):
    """The index, a record it names or the markdown it writes into is not what the report expects."""


@dataclass(frozen=True)
class Number:
    value: float
    source: str  # the record's path relative to the index folder, or "prose: <heading>"
    prose: bool = False


@dataclass(frozen=True)
class Row:
    bundle: str
    figure: str
    unit: str
    today: Number
    baseline: Number | None
    baseline_is: str
    target: float | None  # at most this, in `unit`
    target_speedup: float | None  # or at least this many times faster than the baseline
    target_is: str
    device: str
    date: str


def _step(node, step, where: str):
    if isinstance(step, dict):
        if not isinstance(node, list):
            raise ReportError(f"{where}: expected a list to pick {step} from, found {type(node).__name__}")
        hits = [e for e in node if isinstance(e, dict) and all(e.get(k) == v for k, v in step.items())]
        if len(hits) != 1:
            raise ReportError(f"{where}: expected one element matching {step}, found {len(hits)}")
        return hits[0]
    if isinstance(step, int):
        if not isinstance(node, list) or not -len(node) <= step < len(node):
            raise ReportError(f"{where}: expected a list with index {step}")
        return node[step]
    if not isinstance(node, dict) or step not in node:
        keys = sorted(node) if isinstance(node, dict) else type(node).__name__
        raise ReportError(f"{where}: expected key {step!r}, found {keys}")
    return node[step]


def read_number(ref: dict, base: Path, unit: str, where: str) -> Number:
    """The number `ref` points at, converted from the record's unit (`ref["unit"]`, default the row's) to `unit`."""
    scale = UNITS[ref.get("unit", unit)] / UNITS[unit]
    if "prose" in ref:
        if not isinstance(ref.get("value"), (int, float)):
            raise ReportError(f"{where}: a prose figure needs its number as 'value'")
        return Number(ref["value"] * scale, f"prose: {ref['prose']}", prose=True)
    if "record" not in ref or "path" not in ref:
        raise ReportError(f"{where}: expected {{'record': ..., 'path': [...]}} or {{'prose': ..., 'value': ...}}, "
                          f"found keys {sorted(ref)}")
    record = base / ref["record"]
    if not record.is_file():
        raise ReportError(f"{where}: record {ref['record']} not found (looked for {record})")
    try:
        node = json.loads(record.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{where}: record {ref['record']} is not JSON ({e})") from e
    for step in ref["path"]:
        node = _step(node, step, f"{where}: {ref['record']}")
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ReportError(f"{where}: {ref['record']} {ref['path']} is {node!r}, expected a number")
    return Number(node * scale, ref["record"])


def load_rows(index_path: Path) -> list[Row]:
    """Every row of the index, its numbers read from their records."""
    if not index_path.is_file():
        raise ReportError(f"index {index_path} not found")
    try:
        index = json.loads(index_path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"index {index_path} is not JSON ({e})") from e
    if not isinstance(index, dict) or not isinstance(index.get("rows"), list):
        raise ReportError(f"index {index_path}: expected an object with a list 'rows'")
    rows = []
    for i, r in enumerate(index["rows"]):
        where = f"{index_path.name} row {i + 1} ({r.get('bundle')}, {r.get('figure')})"
        missing = [k for k in ("bundle", "figure", "today", "device", "date") if k not in r]
        if missing:
            raise ReportError(f"{where}: expected keys {missing}")
        unit = r.get("unit", "ms")
        if unit not in UNITS:
            raise ReportError(f"{where}: unit {unit!r}, expected one of {sorted(UNITS)}")
        base = r.get("baseline")
        target = r.get("target") or {}
        rows.append(Row(
            bundle=r["bundle"], figure=r["figure"], unit=unit,
            today=read_number(r["today"], index_path.parent, unit, where),
            baseline=read_number(base, index_path.parent, unit, where) if base else None,
            baseline_is=(base or {}).get("is", r.get("no_baseline", "")),
            target=target.get("value"), target_speedup=target.get("speedup"), target_is=target.get("is", ""),
            device=r["device"], date=r["date"]))
    return rows


def _fmt(v: float) -> str:
    if v < 100:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def _link(n: Number, records: str) -> str:
    if n.prose:
        anchor = re.sub(r"[^\w\- ]", "", n.source[len("prose: "):].lower()).replace(" ", "-")
        return f"prose only: [section](#{anchor})"
    return f"[{n.source}]({Path(records, n.source).as_posix()})"


def table(rows: list[Row], records: str = "benchmarks", chart: str | None = "benchmarks/current.png") -> str:
    """The markdown between the markers: the table, then the chart. Links are relative to the markdown file."""
    out = ["| bundle | figure | today | baseline | vs baseline | target | met | device, date | record |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = r.unit
        base = f"{_fmt(r.baseline.value)} {u} ({r.baseline_is})" if r.baseline else f"- ({r.baseline_is})"
        speed = f"{r.baseline.value / r.today.value:.2f}x" if r.baseline else "-"
        target, met = r.target_is or "-", None
        if r.target is not None:
            target, met = f"{r.target:,g} {u} ({r.target_is})", r.today.value <= r.target
        elif r.target_speedup is not None and r.baseline:
            target = f">= {r.target_speedup:g}x faster than the baseline ({r.target_is})"
            met = r.baseline.value / r.today.value >= r.target_speedup
        met = "-" if met is None else ("yes" if met else "**no**")
        links = _link(r.today, records)
        if r.baseline and r.baseline.source != r.today.source:
            links += "; baseline " + _link(r.baseline, records)
        out.append(f"| {r.bundle} | {r.figure} | **{_fmt(r.today.value)} {u}** | {base} | {speed} | {target} | {met} "
                   f"| {r.device}, {r.date} | {links} |")
    if chart:
        out += ["", f"![Current figures: baseline, today and target per row, log scale]({chart})"]
    return "\n".join(out)


def splice(markdown: str, block: str) -> str:
    """`markdown` with the text between the markers replaced by `block`."""
    if markdown.count(BEGIN) != 1 or markdown.count(END) != 1 or markdown.index(BEGIN) > markdown.index(END):
        raise ReportError(f"expected one {BEGIN!r} line followed by one {END!r} line in the markdown")
    head, rest = markdown.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def draw_chart(rows: list[Row], path: Path) -> None:
    """Per row: the baseline, today and the target, in ms on a log scale (rows mix milliseconds and seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.bundle}: {r.figure}" + (f" [{r.device.split(',')[0]}]" if r.device != rows[0].device else "")
              for r in rows]
    ys = range(len(rows))[::-1]
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.2))
    ms = [UNITS[r.unit] for r in rows]
    base = [r.baseline.value * m if r.baseline else 0 for r, m in zip(rows, ms)]
    today = [r.today.value * m for r, m in zip(rows, ms)]
    ax.barh([y + 0.2 for y in ys], base, height=0.38, color="#b0b0b0", label="baseline (fp32 eager / stock)")
    ax.barh([y - 0.2 for y in ys], today, height=0.38, color="#d9480f", label="rocm_zoo today")
    for y, v, r in zip(ys, today, rows):
        ax.text(max(v, (r.target or 0) * UNITS[r.unit]) * 1.12, y - 0.2, f"{_fmt(r.today.value)} {r.unit}", va="center", fontsize=7)
    tys = [y for y, r in zip(ys, rows) if r.target is not None]
    tvs = [r.target * m for r, m in zip(rows, ms) if r.target is not None]
    ax.scatter(tvs, tys, marker="|", s=400, linewidths=2.5, color="black", zorder=3, label="target")
    ax.set_xscale("log")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.set_xlabel("milliseconds (log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.set_title(f"rocm_zoo, current figures ({rows[0].device} unless marked)", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.4 / (0.42 * len(rows) + 1.2), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def render(index: Path, markdown: Path, chart: Path | None) -> tuple[str, list[Row]]:
    """The text `markdown` should have, with the table made from the index's records, and those rows."""
    rows = load_rows(index)
    if not markdown.is_file():
        raise ReportError(f"markdown {markdown} not found")
    records = Path(os.path.relpath(index.parent, markdown.parent)).as_posix()
    chart_link = Path(os.path.relpath(chart, markdown.parent)).as_posix() if chart else None
    return splice(markdown.read_text(), table(rows, records, chart_link)), rows


def write_report(index: Path, markdown: Path, chart: Path | None) -> list[Row]:
    """Read the records the index names, rewrite the table in `markdown`, draw `chart` (None: skip it)."""
    text, rows = render(index, markdown, chart)
    markdown.write_text(text)
    if chart:
        draw_chart(rows, chart)
    return rows


def check_report(index: Path, markdown: Path, chart: Path | None) -> bool:
    """Whether the table in `markdown` is what the index and its records make today."""
    return render(index, markdown, chart)[0] == markdown.read_text()
