"""Click-to-mask time of a DeepEdit bundle in one process: the stock path against rocm_zoo's.

stock: the bundle's own transforms on the CPU for every click, fp32 eager network (what MONAI Label's
BundleInferTask does, less HTTP and file writing). rocm_zoo: the image-only transforms once per image with the result
kept on the device, the click transforms and post-processing on the device (DeviceGuidanceSignald in place of the
numpy guidance transform), the overlay network; one copy of the uint8 mask to the host. Input: the spleen_10-shaped
phantom, one click at the spleen's centre. Stage times are taken with a device sync between stages.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from monai.apps.deepedit.transforms import AddGuidanceSignalDeepEditd
from monai.transforms import SaveImaged

from rocm_zoo.bench.network import default_overlay, versions
from rocm_zoo.bench.stats import summarise
from rocm_zoo.engine.guidance import DeviceGuidanceSignald
from rocm_zoo.engine.image_cache import fresh_copy, split_image_only
from rocm_zoo.engine.masks import central_voxel, dice
from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.engine.pool import NetworkSpec, build_network
from rocm_zoo.registry import BUNDLES
from rocm_zoo.samples import phantom
from rocm_zoo.samples.phantom_tensor import as_loaded, loaders_without_reader, without_loaders

def _pipeline(bundle_dir: Path, on_device: bool):
    parser = load_config(bundle_dir, BUNDLES[bundle_dir.name].config)
    loaders_without_reader(parser)
    with bundle_on_path(bundle_dir):
        pre = without_loaders(parser.get_parsed_content("preprocessing").transforms)
        post = [t for t in parser.get_parsed_content("postprocessing").transforms if not isinstance(t, SaveImaged)]
    if on_device:
        pre = [DeviceGuidanceSignald.replacing(t) if isinstance(t, AddGuidanceSignalDeepEditd) else t for t in pre]
    head, tail = split_image_only(pre)
    return head, tail, post


def click_once(start, tail, post, net, clicks, device, sync) -> tuple[np.ndarray, dict]:
    """`start()` gives the image-only transforms' output: recomputed (stock) or a copy of the cached one."""
    times = {}
    t = time.perf_counter()
    d = start()
    d.update(clicks)
    for tr in tail:
        d = tr(d)
    sync()
    times["pre_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    d["pred"] = net(d["image"][None].to(device))[0]
    sync()
    times["infer_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    for tr in post:
        d = tr(d)
    mask = torch.as_tensor(d["pred"])[0].to(torch.uint8).cpu().numpy()
    times["post_ms"] = (time.perf_counter() - t) * 1000
    times["total_ms"] = sum(times.values())
    return mask, times


def run_click_bench(bundle_dir: Path, overlay: Path | None, out_dir: Path, runs: int = 20, warmup: int = 5,
                    device: str = "auto") -> dict:
    bundle_dir = Path(bundle_dir).resolve()
    overlay = overlay or default_overlay(bundle_dir.name)
    entry = BUNDLES[bundle_dir.name]
    p = phantom.make_phantom(phantom.SPLEEN10)
    spleen = p.truth == phantom.ORGAN_LABELS["spleen"]
    clicks = {"spleen": [central_voxel(spleen)], "background": []}
    record = {"bundle": bundle_dir.name, "image_shape": list(p.image.shape), "runs": runs, "warmup": warmup,
              "paths": []}
    masks = {}
    for name, on_device, overlays in [("stock (CPU transforms, fp32 eager)", False, ()),
                                      ("rocm_zoo (device transforms, cached image, overlay)", True, (overlay,))]:
        net = build_network(NetworkSpec(bundle_dir, entry.config, entry.weights, overlays, device))
        dev = net.backend.device if on_device else "cpu"
        sync = (lambda: torch.cuda.synchronize()) if net.backend.device.startswith("cuda") else (lambda: None)
        head, tail, post = _pipeline(bundle_dir, on_device)
        def run_head() -> dict:
            d = {"image": as_loaded(p)}
            for tr in head:
                d = tr(d)
            d["image"] = d["image"].to(dev)
            return d

        t = time.perf_counter()
        with bundle_on_path(bundle_dir):
            head_out = run_head()
            sync()
            first_head_ms = (time.perf_counter() - t) * 1000
            start = (lambda: fresh_copy(head_out)) if on_device else run_head
            samples = []
            with net.switch.building():  # compiled from the first click on (see bench.network._row)
                for i in range(warmup + runs):
                    mask, times = click_once(start, tail, post, net, clicks, net.backend.device, sync)
                    if i >= warmup:
                        samples.append(times)
        masks[name] = mask == 1
        row = {"name": name, "network": net.info(), "image_transforms_once_ms": round(first_head_ms, 1)}
        for k in samples[0]:
            row[k] = summarise((s[k] for s in samples), digits=2)
        row["dice_vs_truth"] = round(dice(masks[name], spleen), 4)
        record["paths"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "network"}), flush=True)
    a, b = masks.values()
    record["dice_rocm_zoo_vs_stock"] = round(dice(a, b), 4)
    record["versions"] = versions(net.backend.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "click.json").write_text(json.dumps(record, indent=2))
    print("dice rocm_zoo vs stock:", record["dice_rocm_zoo_vs_stock"])
    return record
