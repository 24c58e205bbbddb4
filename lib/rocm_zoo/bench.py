"""`rocm-zoo bench`: network time of a bundle, fp32 eager baseline vs the overlay (and variants), in one run.

Input is the spleen_10-shaped phantom with one click in the spleen, preprocessed by the bundle's own transforms,
so the numbers are for the tensor a real click produces. Each variant is the bundle config plus overlay files merged
in order; the variants' outputs are compared to the baseline's by Dice per label. The JSON record is the result;
the markdown table and the plot are made from it.
"""

from __future__ import annotations

import datetime
import json
import logging
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose

from rocm_zoo import phantom
from rocm_zoo.backend import describe, detect_backend
from rocm_zoo.masks import central_voxel
from rocm_zoo.overlay import bundle_on_path, load_config, overlay_path
from rocm_zoo.phantom_tensor import as_loaded, loaders_without_reader, without_loaders
from rocm_zoo.pool import NetworkSpec, build_network
from rocm_zoo.registry import BUNDLES
from rocm_zoo.sample import REPO_ROOT

logger = logging.getLogger(__name__)


def default_overlay(bundle: str) -> Path:
    return overlay_path(REPO_ROOT / "apps" / "rocm_zoo" / "overlays", bundle)


@dataclass(frozen=True)
class Variant:
    name: str
    overlay: bool  # merge the bundle's overlay file
    extra: dict  # more overlay keys merged last


def variants(compile_modes: list[str] | None) -> list[Variant]:
    out = [
        Variant("fp32 eager (bundle as shipped)", False, {}),
        Variant("overlay", True, {}),
        Variant("overlay without gemm transpose", True, {"rocm_overlay#gemm_transpose": False}),
    ]
    for mode in compile_modes or []:
        out.append(Variant(f"overlay, compile mode {mode}", True, {"rocm_overlay#compile_mode": mode}))
    return out


def click_input(bundle_dir: Path, spec: phantom.PhantomSpec = phantom.SPLEEN10) -> torch.Tensor:
    """The network input of one click at the spleen's centre, made by the bundle's own transforms (the file loader
    aside: the phantom is handed over in memory)."""
    p = phantom.make_phantom(spec)
    parser = load_config(bundle_dir, BUNDLES[bundle_dir.name].config)
    loaders_without_reader(parser)
    with bundle_on_path(bundle_dir):
        pre = Compose(without_loaders(parser.get_parsed_content("preprocessing").transforms))
    click = central_voxel(p.truth == phantom.ORGAN_LABELS["spleen"])
    with bundle_on_path(bundle_dir):
        x = pre({"image": as_loaded(p), "spleen": [click], "background": []})["image"]
    return torch.as_tensor(x)[None]


def time_forward(net, x: torch.Tensor, runs: int, warmup: int) -> tuple[list[float], float]:
    """Per-forward milliseconds (device events on a GPU) and the seconds of the first call (compile included)."""
    cuda = net.backend.device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(net.backend.device)) if cuda else (lambda: None)
    start = time.perf_counter()
    net(x)
    sync()
    first = time.perf_counter() - start
    for _ in range(warmup):
        net(x)
    sync()
    times = []
    for _ in range(runs):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            net(x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            net(x)
            times.append((time.perf_counter() - t) * 1000)
    return times, first


def dice_per_label(pred: torch.Tensor, ref: torch.Tensor, labels: int) -> dict[str, float]:
    out = {}
    for c in range(1, labels):
        a, b = pred == c, ref == c
        denom = a.sum().item() + b.sum().item()
        out[str(c)] = 1.0 if denom == 0 else 2 * (a & b).sum().item() / denom
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def versions(device: str) -> dict[str, Any]:
    v = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    if device.startswith("cuda"):
        v["gpu"] = torch.cuda.get_device_name(device)
        v["hip"] = getattr(torch.version, "hip", None)
        v["cuda"] = torch.version.cuda
        v["cudnn"] = torch.backends.cudnn.version()
    import monai

    v["monai"] = monai.__version__
    return v


def run_bench(bundle_dir: Path, overlay: Path | None, out_dir: Path, runs: int = 20, warmup: int = 5,
              device: str = "auto", compile_modes: list[str] | None = None, command: str = "") -> dict:
    bundle_dir = Path(bundle_dir).resolve()
    entry = BUNDLES[bundle_dir.name]
    overlay = overlay or default_overlay(bundle_dir.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = detect_backend(device)
    x = click_input(bundle_dir)
    record: dict[str, Any] = {
        "bundle": bundle_dir.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "backend": describe(backend), "versions": versions(backend.device), "input_shape": list(x.shape),
        "runs": runs, "warmup": warmup, "variants": [],
    }
    ref = None
    for v in variants(compile_modes):
        files: tuple[Path, ...] = ()
        if v.overlay:
            files = (overlay,)
        if v.extra:
            extra = out_dir / f"variant-{len(record['variants'])}.json"
            extra.write_text(json.dumps(v.extra))
            files += (extra,)
        net = build_network(NetworkSpec(bundle_dir, entry.config, entry.weights, files, backend.device))
        # the input lives on the device, as in a request: the timing is the network's, not a host copy's
        times, first = time_forward(net, x.to(backend.device), runs, warmup)
        out = net(x.to(backend.device))
        pred = out.argmax(1).cpu()
        ref = pred if ref is None else ref
        row = {"name": v.name, **net.info(), "first_call_s": round(first, 2),
               "p50_ms": round(statistics.median(times), 3), "p90_ms": round(percentile(times, 90), 3),
               "p99_ms": round(percentile(times, 99), 3), "times_ms": [round(t, 3) for t in times],
               "dice_vs_baseline": dice_per_label(pred, ref, out.shape[1])}
        record["variants"].append(row)
        logger.info("%s: p50 %.2f ms", v.name, row["p50_ms"])
        (out_dir / "bench.json").write_text(json.dumps(record, indent=2))  # partial results survive a time-out
        del net
        if backend.device.startswith("cuda"):
            torch.cuda.empty_cache()
    base = record["variants"][0]["p50_ms"]
    for row in record["variants"]:
        row["speedup_vs_baseline"] = round(base / row["p50_ms"], 2)
    (out_dir / "bench.json").write_text(json.dumps(record, indent=2))
    (out_dir / "bench.md").write_text(markdown(record))
    plot(record, out_dir / "bench.png")
    print(markdown(record))
    return record


def markdown(record: dict) -> str:
    v = record["versions"]
    lines = [
        f"### {record['bundle']}: network forward, input {tuple(record['input_shape'])}",
        "",
        f"{record['date']}; {v.get('gpu', 'CPU')}; torch {v['torch']}"
        + (f", cuDNN {v['cudnn']}" if v.get("cudnn") else "") + (f", HIP {v['hip']}" if v.get("hip") else "")
        + f"; MONAI {v['monai']}; {record['runs']} runs after {record['warmup']} warm-ups",
        "",
        "| variant | dtype | layout | gemm transpose | compile | p50 ms | p90 ms | p99 ms | vs fp32 eager | first call s "
        "| Dice vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["variants"]:
        dice = ", ".join(f"{k}: {d:.4f}" for k, d in r["dice_vs_baseline"].items())
        lines.append(
            f"| {r['name']} | {r['dtype']} | {r['memory_format']} | {'yes' if r['gemm_transpose'] else 'no'} "
            f"| {r['compile_mode']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['speedup_vs_baseline']:.2f}x | {r['first_call_s']:.1f} | {dice} |"
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
    names = [r["name"] for r in record["variants"]]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    ax.boxplot([r["times_ms"] for r in record["variants"]], vert=False, tick_labels=names)
    ax.set_xlabel("ms per forward")
    ax.set_title(f"{record['bundle']} on {record['versions'].get('gpu', 'CPU')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
