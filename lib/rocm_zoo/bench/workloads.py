"""What one request asks of a bundle's network, made from a phantom by the bundle's own transforms.

A workload is the request data a client sends (clicks, class prompts), how the bundle runs its network on the
preprocessed image (one forward, a sliding window, VISTA3D's prompt-aware window inferer), and how its output becomes
a label map. The benchmark times `run` and compares the label maps of every variant to the fp32 eager baseline's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from monai.bundle import ConfigParser
from monai.transforms import Compose

from rocm_zoo.engine.masks import central_voxel
from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.registry import BUNDLES, Request
from rocm_zoo.samples import phantom
from rocm_zoo.samples.phantom_tensor import as_loaded, loaders_without_reader, without_loaders


@dataclass(frozen=True)
class Workload:
    name: str
    request: Callable[[phantom.Phantom, ConfigParser], dict]  # request keys added before preprocessing
    run: Callable[[Any, Any, torch.Tensor, dict], torch.Tensor]  # (inferer, network, batch, preprocessed data)
    to_labels: Callable[[torch.Tensor], torch.Tensor]  # network output (batch first) -> integer label map
    notes: dict = field(default_factory=dict)


def _argmax(out: torch.Tensor) -> torch.Tensor:
    return out.argmax(1)


def _vista_labels(out: torch.Tensor) -> torch.Tensor:
    """VISTA3D gives one logit map per prompted class: a voxel belongs to its best class where that logit is > 0."""
    best, idx = out.max(1)
    return torch.where(best > 0, idx + 1, torch.zeros_like(idx))


def class_ids(bundle_dir: Path) -> dict[str, int]:
    """The bundle's output classes by name, as MONAI Label reads them (metadata.json, the prediction's channel_def)."""
    meta = json.loads((Path(bundle_dir) / "configs" / "metadata.json").read_text())
    pred = next(iter(meta["network_data_format"]["outputs"].values()))
    return {v.lower(): int(k) for k, v in pred.get("channel_def", {}).items() if v.lower() != "background"}


def _class_id(parser: ConfigParser, name: str) -> int:
    ids = class_ids(Path(parser["bundle_root"]))
    return ids.get(name, min(ids.values()))  # as the server's warm-up picks it


def _click(r: Request, p: phantom.Phantom, _parser: ConfigParser) -> dict:
    return {r.organ: [central_voxel(p.truth == phantom.ORGAN_LABELS[r.organ])], "background": []}


def _classes(r: Request, _p: phantom.Phantom, parser: ConfigParser) -> dict:
    first = _class_id(parser, r.organ)
    if not r.extra_classes:
        return {"label_prompt": [first]}
    others = [int(c) for c in parser.get_parsed_content("everything_labels") if int(c) != first]
    return {"label_prompt": [first, *others[:r.extra_classes]]}


def _everything(_r: Request, _p: phantom.Phantom, parser: ConfigParser) -> dict:
    return {"label_prompt": list(parser.get_parsed_content("everything_labels"))}


def _vista_run(inferer, network, x: torch.Tensor, data: dict) -> torch.Tensor:
    prompt = torch.as_tensor(data["label_prompt"], device=x.device).reshape(-1, 1)
    return inferer(x, network, class_vector=prompt)


# How the benchmark makes and runs each kind of registry request, by bundle kind: (request keys, run, label map).
RUNS: dict[tuple[str, str], tuple[Callable, Callable, Callable]] = {
    ("deepedit", "click"): (_click, lambda inf, net, x, d: net(x), _argmax),  # the click is a guidance channel
    ("sliding_window", "whole_volume"): (lambda r, p, c: {}, lambda inf, net, x, d: inf(x, net), _argmax),
    ("vista3d", "classes"): (_classes, _vista_run, _vista_labels),
    ("vista3d", "everything"): (_everything, _vista_run, _vista_labels),
}


def workload(bundle_kind: str, request: Request) -> Workload:
    if (bundle_kind, request.kind) not in RUNS:
        known = ", ".join(f"{k} on {b}" for b, k in RUNS)
        raise ValueError(f"rocm-zoo bench cannot time '{request.name}' (a {request.kind} request on a {bundle_kind} "
                         f"bundle); it times: {known}")
    make, run, to_labels = RUNS[bundle_kind, request.kind]
    return Workload(request.name, functools.partial(make, request), run, to_labels)


def workloads_for(bundle: str) -> list[Workload]:
    """The bundle's registry requests marked for the benchmark."""
    entry = BUNDLES[bundle]
    return [workload(entry.kind, r) for r in entry.requests if r.bench]


@dataclass
class Prepared:
    workload: Workload
    batch: torch.Tensor  # the network input, batch first, on the host
    data: dict  # the preprocessed request (prompts after the bundle's own transforms)
    inferer: Any  # the bundle's inferer, as its config makes it


def prepare(bundle_dir: Path, workload: Workload, spec: phantom.PhantomSpec = phantom.SPLEEN10,
            p: phantom.Phantom | None = None) -> Prepared:
    """The phantom through the bundle's own preprocessing (its file loader aside: the phantom is handed over in
    memory, so no reader library is needed) and the bundle's inferer."""
    bundle_dir = Path(bundle_dir)
    p = p or phantom.make_phantom(spec)
    parser = load_config(bundle_dir, BUNDLES[bundle_dir.name].config)
    parser["device"] = "cpu"  # preprocessing on the host: every variant starts from the same tensor
    loaders_without_reader(parser)
    with bundle_on_path(bundle_dir):
        pre = Compose(without_loaders(parser.get_parsed_content("preprocessing").transforms))
        inferer = parser.get_parsed_content("inferer")
        data = pre({"image": as_loaded(p), **workload.request(p, parser)})
    image = data["image"]
    image = image.as_tensor() if hasattr(image, "as_tensor") else torch.as_tensor(image)
    return Prepared(workload, image[None], data, inferer)
