"""VISTA3D's connected-component steps on the GPU, with MONAI's results to the voxel.

After a click VISTA3D keeps only the connected regions that hold the clicks (`keep_merge_components_with_points` in
the network's forward when a click comes with a class, OHIF's request; `keep_components_with_positive_points` in the
bundle's post transform, Slicer's). MONAI labels the regions with cuCIM on the GPU where cuCIM is installed, else it
copies the masks to the host and labels them with scikit-image; ROCm has no cuCIM, and the lent H200 image has none
either. Here the regions are labelled on the device, to scikit-image's numbering order: every voxel of a mask starts
labelled with its own flat index, and rounds of three steps (each a handful of whole-volume kernels) bring every voxel
to the smallest index of its region (its first voxel in C order, by which scikit-image orders its labels):
- each voxel looks at the smallest label among itself and its 26 neighbours (a 3x3x3 filter; 26-connectivity is
  scikit-image's `connectivity=3` in 3-D),
- the voxel its own label points to (its root) takes that if it is smaller (hooking),
- every voxel takes its root's label, twice (pointer jumping).
Labels only ever point into their own region and only decrease; a round that changes nothing leaves one label per
region, its smallest index. Pointer jumping halves chains of labels each round, so a mask takes 5-8 rounds where
spreading a label voxel by voxel took as many filter steps as the region's longest path (90-180 on 128^3 windows,
thousands on a winding one). The values returned order regions as scikit-image's labels do, which MONAI's "largest
label near the click" rule needs.

`route_monai()` (run by `rocm_zoo.vista3d.install`) routes MONAI's two functions here for tensors on a GPU without
cuCIM; anything else still goes to MONAI.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

POINTER_JUMPS = 2  # per round: more jumps, fewer rounds (each round ends with a check that waits for the device)


def label_regions(mask: torch.Tensor) -> torch.Tensor:
    """For a 3-D bool mask, a float map: 0 outside the mask; inside, one value per 26-connected region, larger for a
    region whose first voxel in C order comes earlier (scikit-image numbers regions 1, 2, ... in that order)."""
    n = mask.numel()
    dtype = torch.float32 if n <= 2**24 else torch.float64  # every index exact in the filter: float32 up to 2^24
    inside = mask.to(dtype)[None, None]
    voxels = mask.reshape(-1).nonzero().squeeze(1)
    labels = torch.full((n,), n, dtype=torch.long, device=mask.device)  # n outside: larger than any index
    labels[voxels] = voxels
    while True:
        before = labels[voxels]
        # the filter takes maxima: it runs on n - label, so the largest value is the smallest label
        values = (n - labels).to(dtype).view(inside.shape) * inside
        nearest = n - F.max_pool3d(values, 3, stride=1, padding=1).view(-1)[voxels].long()
        labels.scatter_reduce_(0, before, nearest, "amin")
        for _ in range(POINTER_JUMPS):
            labels[voxels] = labels[labels[voxels]]
        if torch.equal(before, labels[voxels]):  # a round without a change: one label per region, its smallest
            return (n - labels).to(dtype).view(mask.shape) * inside[0, 0]


def _largest_label_near(regions: torch.Tensor, point: Sequence[int], margins: int) -> torch.Tensor | None:
    """MONAI's rule: in the smallest cube around the point (half-side 0, 1, ... margins - 1) that meets a region, the
    region with the largest scikit-image label, i.e. the smallest value here. None if no cube meets one."""
    x, y, z = point
    for margin in range(margins):
        cube = regions[max(x - margin, 0): x + margin + 1, max(y - margin, 0): y + margin + 1,
                       max(z - margin, 0): z + margin + 1]
        inside = cube[cube > 0]
        if inside.numel():
            return regions == inside.min()
    return None


def _rounded(point: torch.Tensor) -> list[int]:
    return point.float().round().int().tolist()


def keep_merge_components_with_points(img_pos: torch.Tensor, img_neg: torch.Tensor, point_coords: torch.Tensor,
                                      point_labels: torch.Tensor, pos_val: Sequence[int] = (1, 3),
                                      neg_val: Sequence[int] = (0, 2), margins: int = 3) -> torch.Tensor:
    """monai.transforms.utils.keep_merge_components_with_points for one mask ([1, 1, H, W, D] bool tensors)."""
    regions = {"pos": label_regions(img_pos[0, 0]), "neg": label_regions(img_neg[0, 0])}
    out = torch.zeros_like(img_pos)
    for p, label in zip(point_coords[0], point_labels[0].tolist()):
        kind = "pos" if label in pos_val else "neg" if label in neg_val else None
        if kind is None:  # a padding point
            continue
        region = _largest_label_near(regions[kind], _rounded(p), margins)
        if region is not None:
            out[0, 0] |= region
    return out


def keep_components_with_positive_points(img: torch.Tensor, point_coords: torch.Tensor,
                                         point_labels: torch.Tensor) -> torch.Tensor:
    """monai.transforms.utils.keep_components_with_positive_points (img [1, B, H, W, D], logits with NaN)."""
    outs = torch.zeros_like(img, dtype=torch.bool)
    for c in range(len(point_coords)):
        positive = (point_labels[c] == 3) | (point_labels[c] == 1)
        if not positive.any():
            continue
        # MONAI lists label-3 points before label-1 points; the kept regions do not depend on the order
        coords = point_coords[c, point_labels[c] == 3].tolist() + point_coords[c, point_labels[c] == 1].tolist()
        not_nan = ~torch.isnan(img[0, c])
        pos_mask = img[0, c] > 0  # NaN compares False, as MONAI's nan_to_num(img > 0) gives
        regions = label_regions(pos_mask)
        for p in coords:
            value = regions[round(p[0]), round(p[1]), round(p[2])]
            if value > 0:
                outs[0, c] |= regions == value
        fill_in = img[0, c][~outs[0, c] & not_nan].mean()
        img[0, c][pos_mask & ~outs[0, c]] = fill_in
    return img


@functools.cache
def _has_cucim() -> bool:
    from monai.utils import optional_import

    return optional_import("cucim.skimage")[1] and optional_import("cupy")[1]


def _on_gpu_without_cucim(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "cpu" and not _has_cucim()


def route_monai() -> None:
    """Route MONAI's VISTA3D component steps here for GPU tensors without cuCIM (idempotent)."""
    import monai.apps.vista3d.transforms as vista_transforms
    import monai.networks.nets.vista3d as vista_net

    if getattr(vista_net.lcc, "rocm_zoo", False):
        return
    monai_merge, monai_keep = vista_net.lcc, vista_transforms.keep_components_with_positive_points

    def merge(img_pos, img_neg, point_coords, point_labels, *args, **kwargs):
        if _on_gpu_without_cucim(img_pos) and img_pos.shape[:2] == (1, 1):
            return keep_merge_components_with_points(img_pos, img_neg, point_coords, point_labels, *args, **kwargs)
        return monai_merge(img_pos, img_neg, point_coords, point_labels, *args, **kwargs)

    def keep(img, point_coords, point_labels):
        if _on_gpu_without_cucim(img):
            return keep_components_with_positive_points(img, point_coords, point_labels)
        return monai_keep(img, point_coords, point_labels)

    merge.rocm_zoo = keep.rocm_zoo = True
    vista_net.lcc, vista_transforms.keep_components_with_positive_points = merge, keep
