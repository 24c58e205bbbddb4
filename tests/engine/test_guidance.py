"""DeviceGuidanceSignald against MONAI's AddGuidanceSignalDeepEditd, which it replaces. CPU only, small volumes.

Both build one channel per label: the clicks as single voxels, Gaussian-smoothed (sigma 3) with MONAI's
GaussianFilter, then min-max scaled to 0..1. Upstream does it in numpy on the host and concatenates numpy arrays;
ours does it in torch on the image's device. The numbers match to float32 rounding: the tolerance 1e-5 is a few
ulps of values in 0..1 (float32 eps is 1.2e-7), room for a different summation order, and far below any change a
wrong click position, sigma or scaling would cause (those move values by 1e-2 or more).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from monai.apps.deepedit.transforms import AddGuidanceSignalDeepEditd
from monai.data import MetaTensor

from rocm_zoo.engine.guidance import DeviceGuidanceSignald, guidance_signal

SHAPE = (1, 24, 20, 16)
TOL = 1e-5  # see the module docstring


def _image(seed: int = 0, shape: tuple[int, ...] = SHAPE) -> MetaTensor:
    g = torch.Generator().manual_seed(seed)
    affine = torch.diag(torch.tensor([1.5, 1.5, 2.0, 1.0], dtype=torch.float64))
    meta = {"affine": affine, "filename_or_obj": "phantom.nii.gz", "spatial_shape": np.array(shape[1:])}
    img = MetaTensor(torch.rand(shape, generator=g), meta=meta)
    img.push_applied_operation({"class": "LoadImaged", "id": 1})
    return img


def _both(image: MetaTensor, guidance: dict, **kwargs) -> tuple[dict, dict]:
    """Run upstream and ours on separate deep copies: both write the result into the input MetaTensor."""
    up = AddGuidanceSignalDeepEditd(keys="image", guidance="guidance", sigma=3, **kwargs)
    ours = DeviceGuidanceSignald(keys="image", guidance="guidance", sigma=3, **kwargs)
    want = up({"image": copy.deepcopy(image), "guidance": copy.deepcopy(guidance)})
    got = ours({"image": copy.deepcopy(image), "guidance": copy.deepcopy(guidance)})
    return want, got


def _max_abs_diff(a, b) -> float:
    return float(np.abs(np.asarray(torch.as_tensor(a).cpu()) - np.asarray(torch.as_tensor(b).cpu())).max())


def test_two_labels_match_upstream():
    image = _image()
    guidance = {"spleen": [[3, 4, 5], [10, 10, 10]], "background": [[20, 2, 1]]}
    want, got = _both(image, guidance)

    out = got["image"]
    assert out.shape == (1 + 2, *SHAPE[1:])
    assert _max_abs_diff(out, want["image"]) < TOL
    # The intensity channel is passed through untouched, the signals are scaled to 0..1 with 1 at the clicks.
    assert torch.equal(out[0].as_tensor(), image[0].as_tensor())
    assert out[1].max().item() == pytest.approx(1.0, abs=TOL) and out[1].min().item() == pytest.approx(0.0, abs=TOL)
    assert out[1, 3, 4, 5].item() == pytest.approx(1.0, abs=TOL)
    assert out[1, 10, 10, 10].item() == pytest.approx(1.0, abs=TOL)
    assert out[2, 20, 2, 1].item() == pytest.approx(1.0, abs=TOL)


def test_output_stays_a_metatensor_and_keeps_its_meta():
    image = _image()
    guidance = {"spleen": [[3, 4, 5]], "background": [[20, 2, 1]]}
    _, got = _both(image, guidance)
    out = got["image"]
    assert isinstance(out, MetaTensor)
    assert torch.equal(out.affine, image.affine)
    assert out.meta["filename_or_obj"] == "phantom.nii.gz"
    assert [op["class"] for op in out.applied_operations] == ["LoadImaged"]
    assert out.dtype == torch.float32
    assert got["guidance"] == guidance  # the clicks are left as they were


def test_label_without_clicks_gives_an_all_zero_channel():
    image = _image(seed=1)
    guidance = {"spleen": [[12, 9, 7]], "background": []}
    want, got = _both(image, guidance)
    assert got["image"].shape == (3, *SHAPE[1:])
    assert _max_abs_diff(got["image"], want["image"]) < TOL
    assert torch.count_nonzero(got["image"][2]).item() == 0


def test_no_label_has_clicks():
    image = _image(seed=2)
    guidance = {"spleen": [], "background": []}
    want, got = _both(image, guidance)
    assert _max_abs_diff(got["image"], want["image"]) < TOL
    assert torch.count_nonzero(got["image"][1:]).item() == 0


def test_negative_point_is_ignored_and_point_beyond_the_image_is_clamped():
    image = _image(seed=3)
    guidance = {"spleen": [[-1, 5, 5], [30, 25, 40]], "background": [[5, -2, 3]]}
    want, got = _both(image, guidance)
    out = got["image"]
    assert _max_abs_diff(out, want["image"]) < TOL
    # (30, 25, 40) lands on the far corner; the negative points leave no trace.
    assert out[1, 23, 19, 15].item() == pytest.approx(1.0, abs=TOL)
    assert out[1, 0, 5, 5].item() < 0.5
    assert torch.count_nonzero(out[2]).item() == 0


def test_clicks_with_a_leading_channel_or_float_coordinates_match_upstream():
    # Clients may send 4-long points (channel first) and floats; both transforms use the last three, truncated.
    image = _image(seed=4)
    guidance = {"spleen": [[0, 3.7, 4.2, 5.9], [0, 10, 10, 10]], "background": [[20.5, 2, 1]]}
    want, got = _both(image, guidance)
    assert _max_abs_diff(got["image"], want["image"]) < TOL
    assert got["image"][1, 3, 4, 5].item() == pytest.approx(1.0, abs=TOL)


def test_several_intensity_channels_keep_only_the_first_n():
    image = _image(seed=5, shape=(2, 16, 12, 10))
    guidance = {"spleen": [[3, 3, 3]]}
    want, got = _both(image, guidance, number_intensity_ch=1)
    assert got["image"].shape == (2, 16, 12, 10)
    assert _max_abs_diff(got["image"], want["image"]) < TOL


def test_plain_tensor_image_stays_a_tensor_and_matches_upstream_values():
    g = torch.Generator().manual_seed(6)
    image = torch.rand(SHAPE, generator=g)
    guidance = {"spleen": [[3, 4, 5]], "background": [[20, 2, 1]]}
    got = DeviceGuidanceSignald(keys="image")({"image": image.clone(), "guidance": guidance})
    want = AddGuidanceSignalDeepEditd(keys="image")({"image": image.numpy().copy(), "guidance": guidance})
    assert torch.is_tensor(got["image"]) and not isinstance(got["image"], MetaTensor)
    assert _max_abs_diff(got["image"], want["image"]) < TOL


def test_replacing_copies_the_upstream_settings():
    up = AddGuidanceSignalDeepEditd(keys="image", guidance="clicks", sigma=2, number_intensity_ch=1)
    ours = DeviceGuidanceSignald.replacing(up)
    assert tuple(ours.keys) == ("image",)
    assert (ours.guidance, ours.sigma, ours.number_intensity_ch) == ("clicks", 2, 1)
    image = _image(seed=7)
    guidance = {"spleen": [[8, 8, 8]]}
    want = up({"image": copy.deepcopy(image), "clicks": guidance})
    got = ours({"image": copy.deepcopy(image), "clicks": guidance})
    assert _max_abs_diff(got["image"], want["image"]) < TOL


def test_guidance_signal_golden_values():
    # One click in the middle of a 9^3 cube, sigma 3. A click's smoothed signal is the separable kernel itself,
    # k(dx) k(dy) k(dz), so after min-max scaling the click is 1 and the eight corners (4, 4, 4 away) are 0.
    # Golden values from this code, identical (diff 0.0) to upstream AddGuidanceSignalDeepEditd on this input.
    # A sampled Gaussian would give (exp(-1/18) - exp(-48/18)) / (1 - exp(-48/18)) = 0.9419 one voxel away; MONAI's
    # default "erf" kernel integrates over each voxel and gives 0.94234. Tolerance 1e-5: float32 rounding only;
    # a wrong sigma (2 or 4) moves these values by more than 0.02.
    s = guidance_signal((9, 9, 9), [[4, 4, 4]], 3, torch.device("cpu"))
    assert s.shape == (1, 9, 9, 9)
    assert s[0, 4, 4, 4].item() == pytest.approx(1.0, abs=1e-5)
    assert s[0, 0, 0, 0].item() == pytest.approx(0.0, abs=1e-5)
    assert s.min().item() == pytest.approx(0.0, abs=1e-5)
    assert s[0, 5, 4, 4].item() == pytest.approx(0.942338, abs=1e-5)
    assert s[0, 4, 4, 0].item() == pytest.approx(0.369600, abs=1e-5)
    # Symmetric about the click.
    assert torch.allclose(s, s.flip(1)) and torch.allclose(s, s.flip(2)) and torch.allclose(s, s.flip(3))


def test_guidance_signal_without_kept_points_is_zero():
    s = guidance_signal((4, 5, 6), [[-1, 0, 0]], 3, torch.device("cpu"))
    assert s.shape == (1, 4, 5, 6)
    assert torch.count_nonzero(s).item() == 0
