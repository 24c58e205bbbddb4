"""VISTA3D (vista3d): clicks, class prompts and "everything", for OHIF and for 3D Slicer.

Two task kinds over one warm network:
- `vista3d` (OHIF v3's type): `points` + `point_labels` with one class in `label_prompt` (the bundle's evaluator
  semantics: the class head's answer edited by the clicks), `label_prompt` alone (those classes), or nothing (the
  bundle's "everything" labels). The mask holds VISTA3D class ids.
- `deepgrow` (what Slicer lists for clicks): `label` names the segment, `foreground` / `background` clicks.
  The clicks with that segment's class, as OHIF's point tab (a name that stands for several classes, e.g. kidney,
  clicks in VISTA3D's point mode, no class head); the mask is 0/1, which Slicer files under that segment.

MONAI Label never runs a bundle's evaluator, so the prompt handling the evaluator does is done here: requests are
checked first (4xx with the reason), the bundle's own prompt transform (subclasses, special-class click labels) is
applied, clicks are mapped through the affine chain into the preprocessed image, and the bundle's own inferer and
postprocessing run. The whole preprocessing depends on the image alone once the prompt transform is set aside, so a
repeated click starts from the cached, preprocessed image on the device.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from monai.apps.vista3d.transforms import VistaPreTransformd
from monai.data import MetaTensor
from monai.transforms import CropForegroundd
from monai.utils import ensure_tuple_rep

from rocm_zoo import vista3d
from rocm_zoo.engine.image_cache import IMAGE_ONLY_TRANSFORMS
from rocm_zoo.engine.warm_volume import VISTA3D_GRID, WarmVolume
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.registry import Request
from rocm_zoo.server.tasks.bundle import OverlayBundleTask
from rocm_zoo.server.tasks.segmentation import input_channels
from rocm_zoo.vista3d.points import image_affines, stored_to_preprocessed
from rocm_zoo.vista3d.predictor import VistaPredictor, embedding_cache
from rocm_zoo.vista3d.prompts import VistaPrompt, from_ohif, from_slicer

# VISTA3D's logit for "not computed" (its NINF_VALUE): voxels outside the click windows, which the window inferer
# leaves NaN, become background rather than the bundle's 255 ("unknown"), which no client would show as nothing.
OUTSIDE_WINDOWS_LOGIT = -9999.0


class Vista3dTask(OverlayBundleTask):
    # With the prompt transform set aside, every preprocessing step depends on the image alone (the crop too: its
    # source is the image), so all of it is cached per image.
    cacheable_transforms = IMAGE_ONLY_TRANSFORMS + (CropForegroundd,)
    # Small (160 x 128 x 60 mm, 4 windows of the tiny sample's 64^3 patch): the warm-up needs the shapes, not volume.
    warm_grid = VISTA3D_GRID

    # -- labels and shapes -------------------------------------------------------------------------------------------
    @functools.cached_property
    def everything(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.bundle_config.get_parsed_content("everything_labels"))

    @functools.cached_property
    def class_names(self) -> dict[int, str]:
        return {i: n for n, i in self.labels.items()}

    def warm_shapes(self) -> list[tuple[int, ...]]:
        # Every window the inferer makes (sliding or around a click) is one roi-sized patch, the image padded to it.
        inferer = self.inferer()
        batch = int(getattr(inferer, "sw_batch_size", 1))
        roi = tuple(int(r) for r in ensure_tuple_rep(inferer.roi_size, 3))
        return [(batch, input_channels(Path(self.bundle_path)), *roi)]

    def class_id(self, name: str) -> int:
        return self.labels.get(name, min(self.labels.values()))

    def encode(self, request: Request, volume: WarmVolume) -> Optional[Dict[str, Any]]:
        """OHIF (type vista3d) sends `points` / `point_labels` / `label_prompt`; Slicer (type deepgrow) can only click,
        naming the segment in `label`."""
        clicks = volume.clicks(request.points)
        if self.entry.kind != "vista3d":
            if request.kind != "click":
                return None
            return {"label": self.class_names[self.class_id(request.organ)], "foreground": clicks, "background": []}
        if request.kind == "click":
            return {"points": clicks, "point_labels": [1] * len(clicks)}
        if request.kind == "click_class":
            return {"points": clicks, "point_labels": [1] * len(clicks), "label_prompt": [self.class_id(request.organ)]}
        if request.kind == "classes":
            first = self.class_id(request.organ)
            return {"label_prompt": [first, *[c for c in self.everything if c != first][:request.extra_classes]]}
        if request.kind == "everything":
            return {}  # nothing but the image: the bundle's "everything" labels
        return super().encode(request, volume)

    def warm(self) -> float:
        seconds = super().warm()
        net = self.pool.peek(self.network_spec())
        if net is not None:
            embedding_cache(net).clear()  # the warm-up image is gone; its windows would only take memory
        return seconds

    # -- prompts ------------------------------------------------------------------------------------------------------
    def parse_prompt(self, request: Dict[str, Any], shape) -> VistaPrompt:
        if self.entry.kind == "vista3d":
            return from_ohif(request, self.labels, shape)
        return from_slicer(request, self.labels, shape)

    def run_pre_transforms(self, data: Dict[str, Any], transforms):
        image_path = data.get(self.input_key)
        prompt_transforms = [t for t in transforms if isinstance(t, VistaPreTransformd)]
        data = super().run_pre_transforms(data, [t for t in transforms if not isinstance(t, VistaPreTransformd)])
        image = data[self.input_key]
        prompt = self.parse_prompt(data, image.meta["spatial_shape"])
        prompt = self._apply_bundle_rules(prompt, prompt_transforms)
        self._put_prompts(data, prompt, image)
        data["vista_image_key"] = self.image_cache_key(image_path) if isinstance(image_path, str) else None
        return data

    def _apply_bundle_rules(self, prompt: VistaPrompt, transforms: list) -> VistaPrompt:
        """The bundle's prompt transform: a class with subclasses becomes them (kidney -> left, right kidney), clicks
        for tumour-like classes get their special labels. "Everything" is the bundle's list."""
        classes = prompt.classes if (prompt.classes or prompt.points) else self.everything
        d = {"label_prompt": None if classes is None else list(classes),
             "point_labels": None if prompt.point_labels is None else list(prompt.point_labels)}
        for t in transforms:
            d = t(d)
        labels = None if d["point_labels"] is None else tuple(int(v) for v in np.asarray(d["point_labels"]).ravel())
        expanded = None if d["label_prompt"] is None else tuple(dict.fromkeys(int(c) for c in d["label_prompt"]))
        several = prompt.points is not None and expanded is not None and len(expanded) > 1
        if prompt.points_only or (prompt.binary and several):
            # the class only decided the click labels; the point head finds the clicked structure
            return VistaPrompt(prompt.classes, prompt.points, labels, points_only=True, binary=prompt.binary)
        if several:
            asked = classes[0]
            parts = ", ".join(f"{c} {self.class_names.get(c, '')}".strip() for c in expanded)
            raise InvalidRequest(f"Class {asked} ('{self.class_names.get(asked, asked)}') stands for {len(expanded)} "
                                 f"classes ({parts}); points segment one class at a time: click with one of them")
        return VistaPrompt(expanded, prompt.points, labels, binary=prompt.binary)

    def _put_prompts(self, data: Dict[str, Any], prompt: VistaPrompt, image: MetaTensor) -> None:
        """The prompts as the bundle's inferer and postprocessing read them (the keys its evaluator fills in)."""
        device = image.device
        data["vista_prompt"] = prompt
        data["label_prompt"] = (None if prompt.points_only or prompt.classes is None
                                else torch.tensor(prompt.classes, device=device).reshape(-1, 1))
        if prompt.points is None:
            data["points"] = data["point_labels"] = None
            return
        coords = stored_to_preprocessed(prompt.points, *image_affines(image))
        # A click can lie outside the crop to the foreground (in the air around the body); the bundle's point
        # postprocessing indexes the volume at each click, so clicks are kept inside it.
        upper = torch.tensor(image.shape[1:], dtype=coords.dtype) - 1
        coords = torch.minimum(coords.clamp(min=0), upper)
        data["points"] = coords.float()[None].to(device)
        data["point_labels"] = torch.tensor(prompt.point_labels, device=device)[None]

    # -- network ------------------------------------------------------------------------------------------------------
    def run_inferer(self, data: Dict[str, Any], convert_to_batch=True, device="cuda"):
        image = data[self.input_key]
        network = self._get_network(device, data)
        inferer = self.inferer(data)
        # component steps and click windows on the device, the encoder cached, the allocator's cache kept
        vista3d.install(network, inferer)
        predictor = VistaPredictor(network, class_bucket=len(self.labels), image_key=data.get("vista_image_key"))
        class_vector = None if data["vista_prompt"].points_only else data["label_prompt"]
        with network.in_use():  # every window of the request on one set of weights (a swap waits for it)
            logits = inferer(image.as_tensor()[None], predictor, point_coords=data["points"],
                             point_labels=data["point_labels"], class_vector=class_vector)
        logits = torch.nan_to_num(torch.as_tensor(logits), nan=OUTSIDE_WINDOWS_LOGIT)[0].to(image.device)
        # The bundle's Invertd takes the transforms to undo from the image; the prediction must be a MetaTensor.
        data[self.output_label_key] = MetaTensor(logits, meta=dict(image.meta))
        return data

    def writer(self, data: Dict[str, Any], extension=None, dtype=None):
        prompt = data.get("vista_prompt")
        if prompt is not None and prompt.binary:
            mask = data[self.output_label_key]
            data[self.output_label_key] = (mask > 0).to(torch.uint8) if torch.is_tensor(mask) else \
                (np.asarray(mask) > 0).astype(np.uint8)
        return super().writer(data, extension, dtype)

    # -- what /info shows --------------------------------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        i = super().info()
        net = self.pool.peek(self.network_spec())
        if net is not None:
            cache = embedding_cache(net)
            i["embedding_cache"] = {"hits": cache.hits, "misses": cache.misses, "entries": len(cache),
                                    "bytes": cache.size_bytes()}
        return i
