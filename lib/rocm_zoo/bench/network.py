"""`rocm-zoo bench`: network/inferer time of a bundle, fp32 eager baseline vs the overlay (and variants), in one run.

Input is the spleen_10-shaped phantom through the bundle's own transforms, with each of the bundle's registry requests
marked for the benchmark (one click in the spleen for DeepEdit, the class prompt [3] and "everything" for VISTA3D),
so the numbers are for the tensor a real request produces; what is timed is what the bundle runs on it: one forward,
or its sliding-window inferer with stitching.
Each variant is the bundle config plus overlay files merged in order; the variants' label maps are compared to the
baseline's by Dice per label. The JSON record is the result; the markdown table and the plot are made from it.
"""

from __future__ import annotations

import datetime
import json
import logging
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rocm_zoo.bench.stats import summarise
from rocm_zoo.bench.workloads import Prepared, prepare, workloads_for
from rocm_zoo.engine.backend import describe, detect_backend
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkSpec, build_network, compiled_graphs
from rocm_zoo.registry import BUNDLES

logger = logging.getLogger(__name__)


def default_overlay(bundle: str) -> Path:
    return overlay_path(OVERLAYS_DIR, bundle)


def overlay_settings(overlay: Path) -> dict:
    """The overlay file's `rocm_overlay` block, as written."""
    from monai.bundle import ConfigParser

    return dict(ConfigParser.load_config_file(str(overlay)).get("rocm_overlay") or {})


@dataclass(frozen=True)
class Variant:
    name: str
    overlay: bool  # merge the bundle's overlay file
    extra: dict  # more overlay keys merged last


def variants(overlay: Path, compile_modes: list[str] | None, sw_batch_sizes: list[int] | None = None,
             extra: dict[str, dict] | None = None) -> list[Variant]:
    # The baseline is the overlay with every optimisation off (an empty settings block): fp32, contiguous, eager,
    # but with the overlay's compatibility fixes, without which some real bundles do not load on current MONAI/torch.
    out = [Variant("fp32 eager (bundle as shipped)", True, {"rocm_overlay": {}}), Variant("overlay", True, {})]
    if overlay_settings(overlay).get("gemm_transpose"):  # what the GEMM form of the transposed convolutions buys
        out.append(Variant("overlay without gemm transpose", True, {"rocm_overlay#gemm_transpose": False}))
    for mode in compile_modes or []:
        out.append(Variant(f"overlay, compile mode {mode}", True, {"rocm_overlay#compile_mode": mode}))
    for n in sw_batch_sizes or []:
        out.append(Variant(f"overlay, sw_batch_size {n}", True, {"inferer#sw_batch_size": n}))
    for name, keys in (extra or {}).items():
        out.append(Variant(f"overlay, {name}", True, keys))
    return out


def time_call(call, device: str, runs: int, warmup: int) -> tuple[list[float], float]:
    """Milliseconds per call (device events on a GPU) and the seconds of the first call (compile included)."""
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    start = time.perf_counter()
    call()
    sync()
    first = time.perf_counter() - start
    for _ in range(warmup):
        call()
    sync()
    times = []
    for _ in range(runs):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1000)
    return times, first


def dice_per_label(pred: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Every label either map holds (background aside); 1.0 where both leave a label out."""
    out = {}
    for c in torch.unique(torch.cat([pred.unique(), ref.unique()])).tolist():
        if c == 0:
            continue
        a, b = pred == c, ref == c
        denom = a.sum().item() + b.sum().item()
        out[str(c)] = 1.0 if denom == 0 else 2 * (a & b).sum().item() / denom
    return out


def versions(device: str) -> dict[str, Any]:
    v = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    if device.startswith("cuda"):
        v["gpu"] = torch.cuda.get_device_name(device)
        v["hip"] = getattr(torch.version, "hip", None)
        v["cuda"] = torch.version.cuda
        v["cudnn"] = torch.backends.cudnn.version()  # MIOpen's version on ROCm builds
    import monai

    v["monai"] = monai.__version__
    return v


def _row(variant: Variant, prepared: Prepared, net, device: str, runs: int, warmup: int, ref) -> tuple[dict, Any]:
    x = prepared.batch.to(device)  # the input lives on the device, as in a request: no host copy is timed
    w = prepared.workload

    def call():
        return w.run(prepared.inferer, net, x, prepared.data)

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    # As the building thread: the first call at each shape compiles and later ones run compiled. Any other thread runs
    # a network eager until its warm-up built it at that shape (engine.compile_switch), which here nothing does.
    with net.switch.building():
        times, first = time_call(call, device, runs, warmup)
        graphs = compiled_graphs()
        labels = w.to_labels(call())
    if net.compiled and net.compile_state() != "compiled":
        raise RuntimeError(f"{variant.name} was timed eager although it compiles: {net.compile_state()}")
    row = {"variant": variant.name, "workload": w.name, "input_shape": list(prepared.batch.shape), **net.info(),
           "first_call_s": round(first, 2), **summarise(times, (50, 90, 99), unit="ms", digits=3),
           "times_ms": [round(t, 3) for t in times],
           "graphs_compiled_during_timing": compiled_graphs() - graphs,
           "dice_vs_baseline": dice_per_label(labels, labels if ref is None else ref),
           "voxel_agreement_vs_baseline": 1.0 if ref is None else (labels == ref).float().mean().item()}
    if device.startswith("cuda"):
        row["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return row, labels


def run_bench(bundle_dir: Path, overlay: Path | None, out_dir: Path, runs: int = 20, warmup: int = 5,
              device: str = "auto", compile_modes: list[str] | None = None, sw_batch_sizes: list[int] | None = None,
              extra_variants: dict[str, dict] | None = None, command: str = "") -> dict:
    bundle_dir = Path(bundle_dir).resolve()
    entry = BUNDLES[bundle_dir.name]
    overlay = overlay or default_overlay(bundle_dir.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = detect_backend(device)
    prepared = [prepare(bundle_dir, w) for w in workloads_for(bundle_dir.name)]
    record: dict[str, Any] = {
        "bundle": bundle_dir.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command, "backend": describe(backend), "versions": versions(backend.device),
        "runs": runs, "warmup": warmup, "rows": [],
    }
    refs: dict[str, Any] = {}
    for i, v in enumerate(variants(overlay, compile_modes, sw_batch_sizes, extra_variants)):
        files: tuple[Path, ...] = (overlay,) if v.overlay else ()
        if v.extra:
            extra = out_dir / f"{bundle_dir.name}-variant-{i}.json"
            extra.write_text(json.dumps(v.extra))
            files += (extra,)
        net = build_network(NetworkSpec(bundle_dir, entry.config, entry.weights, files, backend.device))
        for p in prepared:
            if any(k.startswith("inferer") for k in v.extra):
                p = prepare_with_inferer(bundle_dir, p, files)
            row, labels = _row(v, p, net, backend.device, runs, warmup, refs.get(p.workload.name))
            refs.setdefault(p.workload.name, labels)
            record["rows"].append(row)
            logger.info("%s / %s: p50 %.2f ms", v.name, p.workload.name, row["p50_ms"])
            (out_dir / "bench.json").write_text(json.dumps(record, indent=2))  # partial results survive a time-out
        del net
        if backend.device.startswith("cuda"):
            torch.cuda.empty_cache()
    for row in record["rows"]:
        base = next(r for r in record["rows"] if r["workload"] == row["workload"])["p50_ms"]
        row["speedup_vs_baseline"] = round(base / row["p50_ms"], 2)
    (out_dir / "bench.json").write_text(json.dumps(record, indent=2))
    (out_dir / "bench.md").write_text(markdown(record))
    plot(record, out_dir / "bench.png")
    print(markdown(record))
    return record


def prepare_with_inferer(bundle_dir: Path, p: Prepared, files: tuple[Path, ...]) -> Prepared:
    """The same input with the inferer of a variant that changes the inferer's settings."""
    from rocm_zoo.engine.overlay import bundle_on_path, load_config

    parser = load_config(bundle_dir, BUNDLES[bundle_dir.name].config, files)
    with bundle_on_path(bundle_dir):
        return Prepared(p.workload, p.batch, p.data, parser.get_parsed_content("inferer"))


def markdown(record: dict) -> str:
    v = record["versions"]
    lines = [
        f"### {record['bundle']}",
        "",
        f"{record['date']}; {v.get('gpu', 'CPU')}; torch {v['torch']}"
        + (f", cuDNN {v['cudnn']}" if v.get("cudnn") else "") + (f", HIP {v['hip']}" if v.get("hip") else "")
        + f"; MONAI {v['monai']}; {record['runs']} runs after {record['warmup']} warm-ups",
        "",
        "| workload | input | variant | dtype | layout | compile | p50 ms | p90 ms | p99 ms | vs fp32 eager "
        "| first call s | recompiles | peak GB | voxels equal to baseline | Dice vs baseline (min, labels) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        dice = r["dice_vs_baseline"]
        worst = f"{min(dice.values()):.4f} ({len(dice)})" if dice else "-"
        lines.append(
            f"| {r['workload']} | {'x'.join(map(str, r['input_shape'][1:]))} | {r['variant']} | {r['dtype']} "
            f"| {r['memory_format']} | {r['compile_mode']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['speedup_vs_baseline']:.2f}x | {r['first_call_s']:.1f} "
            f"| {r['graphs_compiled_during_timing']} | {r.get('peak_gpu_memory_gb', '-')} "
            f"| {100 * r['voxel_agreement_vs_baseline']:.2f}% | {worst} |"
        )
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return
    names = [f"{r['workload']}: {r['variant']}" for r in record["rows"]]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.5))
    ax.boxplot([r["times_ms"] for r in record["rows"]], vert=False, tick_labels=names)
    ax.set_xscale("log")
    ax.set_xlabel("ms per call (log scale)")
    ax.set_title(f"{record['bundle']} on {record['versions'].get('gpu', 'CPU')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
