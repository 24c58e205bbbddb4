"""What one request asks of a bundle's network, made from a phantom by the bundle's own transforms.

A workload is the request data a client sends (clicks, class prompts), how the bundle runs its network on the
preprocessed image (one forward, a sliding window, VISTA3D's prompt-aware window inferer), and how its output becomes
a label map. The benchmark times `run` and compares the label maps of every variant to the fp32 eager baseline's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from monai.bundle import ConfigParser
from monai.transforms import Compose

from rocm_zoo.samples import phantom
from rocm_zoo.engine.masks import central_voxel
from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.samples.phantom_tensor import as_loaded, loaders_without_reader, without_loaders
from rocm_zoo.registry import BUNDLES

SPLEEN = phantom.ORGAN_LABELS["spleen"]
VISTA_SPLEEN = 3  # VISTA3D's global class id for the spleen: the bundle's default `label_prompt [3]`


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


def _click(p: phantom.Phantom, _parser: ConfigParser) -> dict:
    return {"spleen": [central_voxel(p.truth == SPLEEN)], "background": []}


def _class_prompt(p: phantom.Phantom, _parser: ConfigParser) -> dict:
    return {"label_prompt": [VISTA_SPLEEN]}


def _everything(_p: phantom.Phantom, parser: ConfigParser) -> dict:
    return {"label_prompt": list(parser.get_parsed_content("everything_labels"))}


def _vista_run(inferer, network, x: torch.Tensor, data: dict) -> torch.Tensor:
    prompt = torch.as_tensor(data["label_prompt"], device=x.device).reshape(-1, 1)
    return inferer(x, network, class_vector=prompt)


WORKLOADS: dict[str, list[Workload]] = {
    "simple": [Workload("one click in the spleen", _click, lambda inf, net, x, d: net(x), _argmax)],
    "sliding_window": [Workload("whole volume", lambda p, c: {}, lambda inf, net, x, d: inf(x, net), _argmax)],
    "vista3d": [
        Workload("label_prompt [3] (spleen)", _class_prompt, _vista_run, _vista_labels),
        Workload("everything", _everything, _vista_run, _vista_labels),
    ],
}


def workloads_for(bundle: str) -> list[Workload]:
    return WORKLOADS[BUNDLES[bundle].inferer]


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
