"""VISTA3D's connected-component steps labelled by propagation on the device give MONAI's (scikit-image's) results to
the voxel: regions kept around clicks inside, next to and away from the masks, positive and negative, on fragmented
and organ-like masks. The propagation runs on the CPU here; on a GPU it is the same torch code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.transforms.utils import keep_components_with_positive_points as monai_keep
from monai.transforms.utils import keep_merge_components_with_points as monai_merge
from scipy import ndimage
from skimage import measure

from rocm_zoo.vista3d import components

SHAPE = (40, 36, 30)


def masks(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    fragmented = ndimage.binary_opening(rng.random(SHAPE) < 0.55)
    organ = np.zeros(SHAPE, bool)
    organ[5:25, 6:30, 4:20] = True
    organ[30:38, 2:10, 22:28] = True  # a second region
    winding = np.zeros(SHAPE, bool)  # one region whose far end is many filter steps from its start
    winding[2, 1:35, 2] = winding[2:38, 34, 2] = winding[37, 1:35, 2] = True
    diagonal = np.zeros(SHAPE, bool)  # joined through corners only: no two voxels share a face or an edge
    for i in range(28):
        diagonal[i + 2, (i * 5) % 34 + 1 if i % 7 == 0 else i + 1, i + 1] = True
    diagonal[np.arange(30) + 5, 34 - np.arange(30), np.arange(30)] = True
    return {"fragmented": fragmented, "organ": organ, "winding": winding, "diagonal": diagonal}


@pytest.mark.parametrize("seed", [0, 1])
def test_regions_order_as_scikit_image_numbers_them(seed):
    for name, mask in masks(seed).items():
        ours = components.label_regions(torch.from_numpy(mask)).numpy()
        theirs = measure.label(mask, connectivity=3)
        assert ((ours > 0) == (theirs > 0)).all(), name
        # one value per region, and the same order as scikit-image's labels (larger value, smaller label)
        pairs = np.unique(np.stack([ours[mask], theirs[mask]]), axis=1)
        assert len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1], name
        assert (np.argsort(-pairs[0]) == np.argsort(pairs[1])).all(), name


def clicks(rng, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    coords = torch.from_numpy(rng.uniform(0, np.array(SHAPE) - 1, size=(1, n, 3))).float()
    labels = torch.from_numpy(rng.choice([0, 1, 2, 3, -1], size=(1, n)))
    return coords, labels


@pytest.mark.parametrize("seed", range(6))
def test_merge_components_with_points_equals_monai(seed):
    rng = np.random.default_rng(seed)
    for name, pos in masks(seed).items():
        neg = ndimage.binary_opening(rng.random(SHAPE) < 0.5) & ~pos
        coords, labels = clicks(rng, 6)
        a, b = torch.from_numpy(pos)[None, None], torch.from_numpy(neg)[None, None]
        expected = monai_merge(a, b, coords, labels)
        got = components.keep_merge_components_with_points(a, b, coords, labels)
        assert got.dtype == torch.bool and torch.equal(got, torch.as_tensor(expected)), name


@pytest.mark.parametrize("seed", range(4))
def test_keep_components_with_positive_points_equals_monai(seed):
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.normal(size=(1, 2, *SHAPE))).float()
    logits[0, 0, :3] = float("nan")  # outside the clicked windows
    coords, labels = clicks(rng, 4)
    coords, labels = torch.cat([coords, clicks(rng, 4)[0]]), torch.cat([labels, torch.tensor([[1, 0, 3, -1]])])
    expected = monai_keep(logits.clone(), coords, labels)
    got = components.keep_components_with_positive_points(logits.clone(), coords, labels)
    assert torch.equal(torch.nan_to_num(got, nan=-9.0), torch.nan_to_num(expected, nan=-9.0))


def test_install_routes_only_gpu_tensors_without_cucim(monkeypatch):
    import monai.apps.vista3d.transforms as vista_transforms
    import monai.networks.nets.vista3d as vista_net

    monkeypatch.setattr(vista_net, "lcc", vista_net.lcc)
    monkeypatch.setattr(vista_transforms, "keep_components_with_positive_points",
                        vista_transforms.keep_components_with_positive_points)
    components.route_monai()
    components.route_monai()  # idempotent: one wrapper, MONAI's function behind it
    assert vista_net.lcc.rocm_zoo and vista_transforms.keep_components_with_positive_points.rocm_zoo
    assert not components._on_gpu_without_cucim(torch.zeros(2))  # CPU tensors stay with MONAI's scikit-image path
    pos = torch.from_numpy(masks(0)["organ"])[None, None]
    coords, labels = torch.tensor([[[10.0, 10.0, 10.0]]]), torch.tensor([[1]])
    assert torch.equal(torch.as_tensor(vista_net.lcc(pos, ~pos, coords, labels)),
                       torch.as_tensor(monai_merge(pos, ~pos, coords, labels)))


def test_a_long_winding_region_takes_few_rounds(monkeypatch):
    """One region whose far end is 1,180 voxels along it from its start: spreading labels voxel by voxel would take
    ~1,180 filter steps; pointer jumping takes 6 rounds here (one 3x3x3 filter each)."""
    mask = np.zeros((4, 40, 60), bool)
    for row in range(0, 40, 2):  # a serpentine: rows joined at alternate ends
        mask[1, row, 1:59] = True
        mask[1, row:row + 2, 58 if row % 4 == 0 else 1] = True
    filters = []
    pool = components.F.max_pool3d
    monkeypatch.setattr(components.F, "max_pool3d", lambda *a, **k: filters.append(1) or pool(*a, **k))
    ours = components.label_regions(torch.from_numpy(mask)).numpy()
    assert measure.label(mask, connectivity=3).max() == 1
    assert len(np.unique(ours[mask])) == 1 and (ours[~mask] == 0).all()
    assert len(filters) <= 12
