"""VISTA3D's click windows stitched where the image is, with MONAI's results to the value.

MONAI's `point_based_window_inferer` runs the windows around the clicks and adds each window's output into two
whole-image tensors it allocates on the host: every click on a GPU then copies the window to the host, fills, divides
and slices an image-sized array there, and the caller copies it back. `point_based_window_inferer` here is the same
algorithm (same windows, same padding, the same sum of overlapping windows divided by a 0/1 coverage, NaN where no
window ran, `prev_mask` where one is given) with the tensors on the input's device, and without MONAI's deep copy of
the image.

The bundle's inferer (`scripts/inferer.py`, unchanged) imports MONAI's function by name; `route_inferer(inferer)` (run
by `rocm_zoo.vista3d.install`) points that name, in the inferer's own module, here.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Sequence

import torch
from monai.apps.vista3d import inferer as monai_inferer
from monai.apps.vista3d.inferer import _get_window_idx, _pad_previous_mask
from monai.data import MetaTensor

from rocm_zoo.vista3d.predictor import VistaPredictor


def point_based_window_inferer(inputs: torch.Tensor, roi_size: Sequence[int], predictor: Any,
                               point_coords: torch.Tensor, point_labels: torch.Tensor,
                               class_vector: torch.Tensor | None = None, prompt_class: torch.Tensor | None = None,
                               prev_mask: torch.Tensor | None = None, point_start: int = 0, center_only: bool = True,
                               margin: int = 5, **kwargs: Any) -> torch.Tensor:
    """monai.apps.vista3d.inferer.point_based_window_inferer, stitched on `inputs.device`: [1, B, H, W, D] logits."""
    if point_coords.shape[0] != 1:
        raise ValueError("Only supports single object point click.")
    if len(inputs.shape) != 5:
        raise ValueError("Input image should be 5D.")
    image, pad = _pad_previous_mask(inputs, roi_size)  # a new tensor when padded; read only when not
    point_coords = point_coords + torch.tensor([pad[-2], pad[-4], pad[-6]], device=point_coords.device)
    if prev_mask is not None:
        prev_mask = _pad_previous_mask(prev_mask, roi_size)[0]
    windows = []
    for p in point_coords[0][point_start:].tolist():
        xs, ys, zs = (_get_window_idx(p[axis], roi_size[axis], image.shape[-3 + axis], center_only=center_only,
                                      margin=margin) for axis in range(3))
        windows += [(slice(None), slice(None), slice(int(lx), int(rx)), slice(int(ly), int(ry)),
                     slice(int(lz), int(rz))) for lx, rx in zip(*xs) for ly, ry in zip(*ys) for lz, rz in zip(*zs)]
    stitched: torch.Tensor | None = None
    covered: torch.Tensor | None = None
    # All of a click's windows in one turn. Where clicks take queued turns (a CPU, or a GPU without interactive streams)
    # a study's window batch would otherwise take the device between two of them (engine.scheduler).
    with predictor.turn() if isinstance(predictor, VistaPredictor) else nullcontext():
        for window in windows:
            output = predictor(image[window], point_coords=point_coords, point_labels=point_labels,
                               class_vector=class_vector, prompt_class=prompt_class, patch_coords=[window],
                               prev_mask=prev_mask, **kwargs)
            if stitched is None:
                shape = [1, output.shape[1], *image.shape[-3:]]
                stitched = torch.zeros(shape, device=image.device)
                covered = torch.zeros(shape, dtype=torch.bool, device=image.device)
            stitched[window] += output.to(image.device)
            covered[window] = True
    if stitched is None:
        raise ValueError("Input configuration resulted in no prediction windows being selected.")
    # MONAI divides by its 0/1 coverage: the sum where a window ran, 0 / 0 = NaN where none did.
    stitched = torch.where(covered, stitched, torch.nan)
    unpad = (slice(None), slice(None), slice(pad[4], image.shape[-3] - pad[5]),
             slice(pad[2], image.shape[-2] - pad[3]), slice(pad[0], image.shape[-1] - pad[1]))
    stitched, covered = stitched[unpad], covered[unpad]
    if prev_mask is not None:
        prev_mask = prev_mask[unpad].to(stitched.device)
        stitched[~covered] = prev_mask[~covered].to(stitched.dtype)
    return MetaTensor(stitched, meta=(inputs if isinstance(inputs, MetaTensor) else MetaTensor(inputs)).meta)


def route_inferer(inferer: Any) -> None:
    """Where the bundle's inferer calls MONAI's point window inferer by the name it imported, call this one."""
    # The inferer's module by its functions' globals: each task imports the bundle's `scripts` afresh and
    # `bundle_on_path` drops them from sys.modules, so the module may be in no registry.
    names = getattr(type(inferer).__call__, "__globals__", {})
    if names.get("point_based_window_inferer") is monai_inferer.point_based_window_inferer:
        names["point_based_window_inferer"] = point_based_window_inferer
