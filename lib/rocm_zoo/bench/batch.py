"""`rocm-zoo bench-batch`: one study end to end (image file on disk -> label file on disk), stock MONAI Label vs
rocm_zoo, per batch bundle, in one process.

"stock" is MONAI Label's own `BundleInferTask` on the bundle (fp32, eager, its transforms on the host, its writer),
with only the overlay's compatibility fixes merged (without them swin_unetr_btcv and pancreas_ct_dints do not load
on current MONAI/torch), and the request's `image_path` kept away from the bundle's Spacingd (MONAI Label 0.8.5 on
MONAI 1.6 fails there otherwise, for every bundle that resamples). "rocm_zoo" is the server's SegmentationTask on the warm overlay network (preprocessing,
stitching, argmax and inversion on the device, one uint8 copy back). Both are called as the server calls them, with a
study path, and both write their label file; the labels are compared by Dice per label. Every study runs `--repeats`
times per path; the warm-up (compile) of rocm_zoo is reported apart. Needs monailabel (the server's wheels).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch

from rocm_zoo.bench.network import default_overlay, dice_per_label, versions
from rocm_zoo.bench.stats import medians, percentile, summarise
from rocm_zoo.engine.backend import describe, detect_backend
from rocm_zoo.registry import BUNDLES, TASKS
from rocm_zoo.samples import phantom

logger = logging.getLogger(__name__)
PHANTOMS = {"spleen10": phantom.SPLEEN10, "ct512x397": phantom.CT512X397}
COMPAT_ONLY = {"rocm_overlay": {}}  # the benchmark's fp32 eager baseline: the overlay with every optimisation off


def write_phantoms(names: list[str], studies: Path) -> list[Path]:
    studies.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        spec = PHANTOMS[name]
        image = studies / f"{spec.name}.nii.gz"
        if not image.exists():
            phantom.write_phantom(phantom.make_phantom(spec), image, studies / "truth" / f"{spec.name}.nii.gz")
        paths.append(image)
    return paths


def stock_task(bundle_dir: Path, compat: Path):
    from monailabel.tasks.infer.bundle import BundleInferTask

    from rocm_zoo.engine.overlay import load_config

    class StockWithCompatibilityFixes(BundleInferTask):
        def _load_bundle_config(self, path, config):
            return load_config(Path(path), BUNDLES[Path(path).name].config, (default_overlay(Path(path).name), compat))

        def run_pre_transforms(self, data, transforms):
            # MONAI 1.6's Spacingd updates every `image_*` entry of a NIfTI request as a metadata dict; MONAI Label
            # 0.8.5 puts the path string under `image_path` (AttributeError: 'str' object has no attribute 'update').
            path = data.pop("image_path", None)
            out = super().run_pre_transforms(data, transforms)
            if path is not None:
                out["image_path"] = path
            return out

    return StockWithCompatibilityFixes(str(bundle_dir), conf={})


def rocm_zoo_task(bundle_dir: Path, device: str):
    from rocm_zoo.engine.image_cache import ImageCache
    from rocm_zoo.engine.pool import NetworkPool
    from rocm_zoo.server.tasks.segmentation import SegmentationTask

    entry = next(t for t in TASKS.values() if t.bundle == bundle_dir.name and t.kind == "segmentation")
    return SegmentationTask(entry, bundle_dir, (default_overlay(bundle_dir.name),), NetworkPool(), ImageCache(0),
                            device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_study(task, image: Path, device: str, request: dict) -> tuple[float, Path, float | None, dict]:
    """Seconds from the image file to the label file, the label file, the peak GPU memory (GB) it took, and the
    task's own stage latencies (MONAI Label's pre / infer / post / write)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    start = time.perf_counter()
    label, result = task({"image": str(image), "result_extension": ".nii.gz", **request})
    _sync(device)
    seconds = time.perf_counter() - start
    peak = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.startswith("cuda") else None
    stages = {k: v for k, v in (result or {}).get("latencies", {}).items() if isinstance(v, (int, float))}
    return seconds, Path(label), peak, stages


def _labels(path: Path) -> np.ndarray:
    return np.asarray(nib.load(str(path)).dataobj).squeeze().astype(np.int32)


def run_batch_bench(bundle_dirs: list[Path], images: list[Path], out_dir: Path, repeats: int = 3,
                    device: str = "auto", paths: tuple[str, ...] = ("stock", "rocm_zoo"), command: str = "") -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = detect_backend(device)
    dev = backend.device
    compat = out_dir / "compat_only.json"
    compat.write_text(json.dumps(COMPAT_ONLY))
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "backend": describe(backend), "versions": versions(dev), "repeats": repeats, "rows": [],
    }
    for bundle_dir in map(lambda p: Path(p).resolve(), bundle_dirs):
        labels: dict[tuple[str, str], np.ndarray] = {}
        for path in paths:
            start = time.perf_counter()
            if path == "stock":
                task, request = stock_task(bundle_dir, compat), {"device": dev}
                warm_s = None
            else:
                task, request = rocm_zoo_task(bundle_dir, dev), {}
                task.warm()
                warm_s = round(time.perf_counter() - start, 1)
            for image in images:
                times, peaks, stages = [], [], []
                for _ in range(repeats):
                    seconds, label, peak, stage = time_study(task, image, dev, request)
                    times.append(seconds)
                    peaks.append(peak)
                    stages.append(stage)
                    labels[(path, image.name)] = _labels(label)
                    label.unlink(missing_ok=True)
                shape = list(nib.load(str(image)).shape)
                row = {"bundle": bundle_dir.name, "path": path, "study": image.name, "study_shape": shape,
                       "warm_s": warm_s, **summarise(times, unit="s", digits=3),
                       "times_s": [round(t, 3) for t in times],
                       "studies_per_min": round(60 / percentile(times, 50), 2),
                       "peak_gpu_memory_gb": max(peaks) if peaks[0] is not None else None,
                       "stage_p50_s": medians(stages, digits=3, missing=0.0)}
                record["rows"].append(row)
                logger.info("%s %s %s: p50 %.2f s", bundle_dir.name, path, image.name, row["p50_s"])
                (out_dir / "batch.json").write_text(json.dumps(record, indent=2))  # partial results survive a time-out
            del task
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
        for row in record["rows"]:
            ref = labels.get(("stock", row["study"])) if row["bundle"] == bundle_dir.name else None
            mine = labels.get((row["path"], row["study"])) if row["bundle"] == bundle_dir.name else None
            if ref is not None and mine is not None:
                dice = dice_per_label(torch.from_numpy(mine), torch.from_numpy(ref))
                row["dice_vs_stock"] = {label: round(d, 5) for label, d in dice.items()}
                row["voxels_equal_to_stock"] = round(float((mine == ref).mean()), 5)
    (out_dir / "batch.json").write_text(json.dumps(record, indent=2))
    (out_dir / "batch.md").write_text(markdown(record))
    print(markdown(record))
    return record


def markdown(record: dict) -> str:
    v = record["versions"]
    lines = [f"{record['date']}; {v.get('gpu', 'CPU')}; torch {v['torch']}; MONAI {v['monai']}; "
             f"{record['repeats']} runs per study and path", "",
             "| bundle | study | path | p50 s | p90 s | studies/min | vs stock | peak GPU GB | warm-up s "
             "| voxels equal to stock | Dice vs stock (min, labels) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        stock = next((s for s in record["rows"] if s["bundle"] == r["bundle"] and s["study"] == r["study"]
                      and s["path"] == "stock"), None)
        ratio = f"{stock['p50_s'] / r['p50_s']:.2f}x" if stock else "-"
        dice = r.get("dice_vs_stock") or {}
        worst = f"{min(dice.values()):.4f} ({len(dice)})" if dice else "-"
        equal = f"{100 * r['voxels_equal_to_stock']:.2f}%" if "voxels_equal_to_stock" in r else "-"
        lines.append(f"| {r['bundle']} | {r['study']} | {r['path']} | {r['p50_s']:.3f} | {r['p90_s']:.3f} "
                     f"| {r['studies_per_min']:.1f} | {ratio} | {r['peak_gpu_memory_gb'] or '-'} "
                     f"| {r['warm_s'] if r['warm_s'] is not None else '-'} | {equal} | {worst} |")
    return "\n".join(lines) + "\n"
