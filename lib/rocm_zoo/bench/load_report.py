"""The markdown tables and the plot of a `rocm-zoo bench-load` record, made from the record only."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rocm_zoo.bench.load_stats import OUTCOMES
from rocm_zoo.bench.server_resources import RESOURCES

logger = logging.getLogger(__name__)


def _cell(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mix(mix: dict) -> str:
    parts = [f"{v} {k}" for k, v in mix.items() if k != "batch" and v]
    if mix.get("batch"):
        parts.append(f"batch {mix['batch']}")
    return ", ".join(parts)


def markdown(record: dict) -> str:
    s = record["server"]
    lines = [f"{record['date']}; server {s['url']} ({s.get('backend') or 'backend unknown'}); "
             f"locust {record['versions'].get('locust')}; think time {record['think_time_s']:g} s; "
             f"command `{record['command']}`", ""]
    for name, phase in record["phases"].items():
        lines += [f"### {name}: {_mix(phase['mix'])}, {phase['duration_s']:g} s", "",
                  "| series | user | requests | p50 ms | p90 ms | p99 ms | max ms | per s | "
                  + " | ".join(OUTCOMES) + " |",
                  "|---|---|---|---|---|---|---|---|" + "---|" * len(OUTCOMES)]
        for series, r in phase["series"].items():
            lines.append(f"| {series} | {r['user']} | {r['requests']} | {_cell(r.get('p50_ms'))} | "
                         f"{_cell(r.get('p90_ms'))} | {_cell(r.get('p99_ms'))} | {_cell(r.get('max_ms'))} | "
                         f"{r['throughput_per_s']:.2f} | " + " | ".join(str(r[k]) for k in OUTCOMES) + " |")
        problems = {k: r["problems"] for k, r in phase["series"].items() if r.get("problems")}
        for series, p in problems.items():
            lines.append(f"\n{series}: " + "; ".join(f"{n}x {what}" for what, n in p.items()))
        if phase.get("batch"):
            b = phase["batch"]
            lines.append(f"\nbatch {b.get('model')}: {b.get('state')}, {b.get('done')}/{b.get('total')} studies "
                         f"({b.get('failed')} failed), {b.get('studies_per_min')} per min")
        lines.append("")
    if record.get("ratios"):
        lines += ["### under the mix / alone", "", "| series | p50 | p90 | p99 | throughput |", "|---|---|---|---|---|"]
        for series, r in record["ratios"].items():
            lines.append(f"| {series} | " + " | ".join(_cell(r.get(k), "{:.2f}x") for k in
                                                        ("p50_ms", "p90_ms", "p99_ms", "throughput_per_s")) + " |")
        lines.append("")
    res = record.get("resources", {})
    if res.get("rss_mb") or res.get("gpu_mb"):
        lines += ["### server resources (whole run; start and end: medians of the first and last tenth)", "",
                  "| what | start | end | max | growth |", "|---|---|---|---|---|"]
        for key, what in RESOURCES.items():
            g = res.get(key)
            if g:
                lines.append(f"| {what} | {g['start']:.1f} | {g['end']:.1f} | {g['max']:.1f} | "
                             f"{_cell(g['growth_pct'], '{:+.1f}%')} |")
        lines.append("")
    elif res.get("note"):
        lines += [f"server memory: {res['note']}", ""]
    if record.get("targets"):
        lines += ["### targets (issue 14, for the mixed load on one H200)", "", "| target | value | met |",
                  "|---|---|---|"]
        for t in record["targets"]:
            met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
            lines.append(f"| {t['target']} | {_cell(t['value'], '{:g}')} | {met} |")
        lines.append("")
    return "\n".join(lines)


def plot(record: dict, path: Path) -> Path | None:
    """Latency over time, one line per series (median per time bucket, the band up to its slowest), every phase
    one after the other on the x axis; below, the server's memory. None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return None

    res = record.get("resources", {}).get("samples") or []
    fig, axes = plt.subplots(2 if res else 1, 1, figsize=(11, 7 if res else 4.5), squeeze=False, sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if res else None)
    ax = axes[0][0]
    colours: dict[str, Any] = {}
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for name, phase in record["phases"].items():
        offset = phase["start"] - record["start"]
        ax.axvline(offset, color="grey", lw=0.6, ls=":")
        ax.text(offset, 0.99, f" {name}", transform=ax.get_xaxis_transform(), fontsize=7, va="top", rotation=90,
                color="grey")
        for series, rows in phase["timeline"].items():
            rows = [r for r in rows if r[2] is not None]
            if not rows:
                continue
            colour = colours.setdefault(series, cycle[len(colours) % len(cycle)])
            x = [offset + r[0] for r in rows]
            ax.plot(x, [r[2] for r in rows], color=colour, lw=1.2, marker=".", ms=3,
                    label=series if series not in ax.get_legend_handles_labels()[1] else None)
            ax.fill_between(x, [r[2] for r in rows], [r[3] for r in rows], color=colour, alpha=0.15, lw=0)
    ax.set_yscale("log")
    ax.set_ylabel("latency ms (median per bucket; band to max)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"rocm-zoo bench-load, {record['date']}", fontsize=9)
    if res:
        mem = axes[1][0]
        x = [r["t"] - record["start"] for r in res]
        mem.plot(x, [r["rss_mb"] for r in res], label="server RSS")
        if any("gpu_mb" in r for r in res):
            mem.plot([xi for xi, r in zip(x, res) if "gpu_mb" in r], [r["gpu_mb"] for r in res if "gpu_mb" in r],
                     label="server GPU memory")
        mem.set_ylabel("MiB")
        mem.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1][0].set_xlabel("seconds since the first phase started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
