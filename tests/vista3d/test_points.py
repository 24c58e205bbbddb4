"""Clicks on the stored image land on the same anatomy in the image VISTA3D sees, through the vista3d bundle's own
preprocessing (1.5 mm resampling, crop to foreground, reorientation to RAS), for images stored in RAS and in LPS with
anisotropic voxels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from monai.transforms import CropForegroundd, Spacingd
from scipy import ndimage

from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import vista3d, write_sample_bundle
from rocm_zoo.vista3d.points import image_affines, stored_to_preprocessed

SPLEEN = phantom.ORGAN_LABELS["spleen"]
# Above the bundle's HU window (a_max 1053.7), so the spleen is exactly 1.0 after its intensity scaling wherever the
# resampling stencil lies wholly inside it, and nothing else reaches 1.0 (bone cortex is 900 HU): the bundle's own
# transforms carry the truth into the preprocessed grid.
MARKER_HU = 2000
SEED = phantom.test_specs(1)[0].seed
# Anisotropic (3.6 x 4.3 x 6 mm) with a field of view wider than the body, so the crop to the foreground removes
# air on every side; the same anatomy stored both ways.
SPECS = [phantom.PhantomSpec(f"points_{o.lower()}", (120, 100, 22), (3.6, 4.3, 6.0), seed=SEED, orientation=o)
         for o in ("RAS", "LPS")]


@pytest.fixture(scope="module")
def preprocessing(tmp_path_factory):
    bundle = write_sample_bundle(tmp_path_factory.mktemp("vista_points") / "model", vista3d, "tiny")
    parser = load_config(bundle, "configs/inference.json")
    parser["device"] = "cpu"
    with bundle_on_path(bundle):
        return parser.get_parsed_content("preprocessing")


def _marked_image(spec: phantom.PhantomSpec, folder: Path) -> tuple[Path, np.ndarray]:
    p = phantom.make_phantom(spec)
    image = p.image.copy()
    image[p.truth == SPLEEN] = MARKER_HU
    marked = phantom.Phantom(spec, image, p.truth, p.affine)
    path = folder / f"{spec.name}.nii.gz"
    phantom.write_phantom(marked, path, folder / f"{spec.name}_truth.nii.gz")
    return path, p.truth == SPLEEN


def _interior_clicks(mask: np.ndarray, n: int = 25) -> np.ndarray:
    """Spleen voxels two voxels from its edge (so the resampling stencil around them is all spleen), spread out."""
    inner = np.argwhere(ndimage.binary_erosion(mask, iterations=2))
    assert len(inner) >= n, "the phantom's spleen is too small for this test"
    return inner[np.linspace(0, len(inner) - 1, n).astype(int)]


def test_affine_chain_on_a_known_case():
    # stored: 2 mm voxels, LPS-flipped in x and y around a 10-voxel grid, origin at (5, 6, 7) mm
    original = np.array([[-2, 0, 0, 5 + 18], [0, -2, 0, 6 + 18], [0, 0, 2, 7], [0, 0, 0, 1]], float)
    # preprocessed: 1 mm RAS voxels starting at world (5, 6, 7)
    current = np.array([[1, 0, 0, 5], [0, 1, 0, 6], [0, 0, 1, 7], [0, 0, 0, 1]], float)
    mapped = stored_to_preprocessed([[0, 0, 0], [9, 0, 3], [4.5, 2, 1]], original, current)
    assert torch.allclose(mapped, torch.tensor([[18.0, 18, 0], [0, 18, 6], [9, 14, 2]], dtype=torch.float64))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.orientation)
def test_clicks_land_on_the_clicked_organ_after_preprocessing(preprocessing, tmp_path, spec):
    path, spleen = _marked_image(spec, tmp_path)
    data = preprocessing({"image": str(path)})
    image = data["image"]
    pre = image[0].numpy()
    assert list(image.meta["spatial_shape"]) == list(spec.shape), "bounds checks use the stored shape"

    # the chain really crops and (for LPS) flips: a shape ratio would not do
    resampled = next(t for t in preprocessing.transforms if isinstance(t, Spacingd))(
        preprocessing.transforms[1](preprocessing.transforms[0]({"image": str(path)})))["image"]
    assert any(isinstance(t, CropForegroundd) for t in preprocessing.transforms)
    assert all(a < b for a, b in zip(pre.shape, resampled.shape[1:3])), "the crop must remove air in x and y"

    clicks = _interior_clicks(spleen)
    mapped = stored_to_preprocessed(clicks, *image_affines(image)).round().long().numpy()
    assert ((mapped >= 0) & (mapped < np.array(pre.shape))).all()
    values = pre[tuple(mapped.T)]
    assert (values >= 0.999).all(), f"{(values < 0.999).sum()} of {len(values)} clicks missed the spleen"

    # the shape-ratio mapping misses on the flipped, cropped image
    ratio = (clicks * np.array(pre.shape) / np.array(spec.shape)).round().astype(int)
    ratio_hits = (pre[tuple(np.minimum(ratio, np.array(pre.shape) - 1).T)] >= 0.999).mean()
    if spec.orientation == "LPS":
        assert ratio_hits < 0.5, "this test would not tell the right mapping from a shape ratio"
