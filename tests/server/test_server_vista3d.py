"""vista3d through a real MONAI Label server: prompts as OHIF v3 sends them (type `vista3d`), clicks as 3D Slicer
sends them (the deepgrow-typed `vista3d_slicer`), bad prompts, caches and recompiles.

The tiny sample's weights are trained on phantoms (`rocm-zoo train-sample`): a click in the spleen, from either viewer,
gives the spleen. The other tests check what holds for any weights: the mask is on the image's grid, holds only the
classes asked for, and for clicks is background beyond the one window around each click, a window that sits on the
click (on an LPS-stored image a click mapped without the flip would put it on the mirrored side, 100+ mm away).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time

import numpy as np
import pytest
import requests
import SimpleITK as sitk

from zoo_test_support import LPS_SPEC, wait_all_warm
from rocm_zoo.engine.masks import central_voxel, dice
from rocm_zoo.samples import phantom

pytestmark = pytest.mark.slow

VISTA_SPLEEN, VISTA_LIVER, VISTA_KIDNEY = 3, 1, 2
# One window of the tiny sample: 64 voxels of 1.5 mm. A window centred on a click reaches 48 mm from it; one pushed
# inward at the volume's edge still holds the click, so no window voxel is more than 96 mm from it (plus a voxel).
WINDOW_REACH_MM = 64 * 1.5 + 6
# Small enough for a whole-volume prompt to take seconds on a CPU (12 windows), wide enough (240 x 192 mm) to have
# voxels beyond a click's window; LPS-stored, spleen inside.
SMALL = phantom.PhantomSpec("vista_small", (60, 48, 16), (4.0, 4.0, 5.0), seed=phantom.test_specs(1)[0].seed,
                            orientation="LPS")


def _post(server: str, model: str, image: str, params) -> requests.Response:
    body = params if isinstance(params, str) else json.dumps(params)
    return requests.post(f"{server}/infer/{model}", params={"image": image, "output": "image"},
                         files={"params": (None, body)})


def infer(server: str, model: str, image: str, params: dict) -> np.ndarray:
    """The mask as (x, y, z) voxels of the stored image, after checking it has the image's geometry."""
    r = _post(server, model, image, {"result_extension": ".nrrd", "result_dtype": "uint8", **params})
    assert r.status_code == 200, r.text
    with tempfile.NamedTemporaryFile(suffix=".nrrd") as f:
        f.write(r.content)
        f.flush()
        mask = sitk.ReadImage(f.name)
    return mask, sitk.GetArrayFromImage(mask).transpose(2, 1, 0)


def same_grid(mask: sitk.Image, image_path) -> None:
    image = sitk.ReadImage(str(image_path))
    assert mask.GetSize() == image.GetSize()
    assert np.allclose(mask.GetSpacing(), image.GetSpacing(), atol=1e-4)
    assert np.allclose(mask.GetOrigin(), image.GetOrigin(), atol=1e-3)
    assert np.allclose(mask.GetDirection(), image.GetDirection(), atol=1e-5)


def far_from(click, spacing, shape) -> np.ndarray:
    """Voxels more than a window's reach from the click along some axis (the phantoms' axes are the world's)."""
    grids = np.meshgrid(*[np.abs(np.arange(n) - c) * s for n, c, s in zip(shape, click, spacing)], indexing="ij")
    return np.maximum.reduce(grids) > WINDOW_REACH_MM


def model_info(server: str, model: str = "vista3d") -> dict:
    return requests.get(f"{server}/info/").json()["models"][model]


@pytest.fixture(scope="module")
def small_study(server, sample_env, tmp_path_factory):
    """A small study in the datastore for whole-volume prompts; removed again afterwards."""
    written = tmp_path_factory.mktemp("vista_small") / f"{SMALL.name}.nii.gz"
    phantom.write_phantom(phantom.make_phantom(SMALL), written, sample_env.paths.truth / f"{SMALL.name}.nii.gz")
    image = sample_env.paths.studies / written.name
    shutil.copyfile(written, image)  # the datastore notices files created in its folder (not ones renamed into it)
    _wait_listed(server, SMALL.name, True)
    yield SMALL.name
    image.unlink()
    _wait_listed(server, SMALL.name, False)


def _wait_listed(server: str, image_id: str, present: bool, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if (image_id in requests.get(f"{server}/datastore/?output=all").json()["objects"]) == present:
            return
        time.sleep(0.5)
    pytest.fail(f"{image_id} {'not ' if present else ''}listed by the datastore after {timeout_s} s")


def test_info_lists_vista3d_for_ohif_and_slicer_with_vista_labels(server):
    models = requests.get(f"{server}/info/").json()["models"]
    assert models["vista3d"]["type"] == "vista3d"
    assert models["vista3d_slicer"]["type"] == "deepgrow"
    for name in ("vista3d", "vista3d_slicer"):
        labels = models[name]["labels"]
        assert len(labels) == 132 and "background" not in labels
        assert labels["liver"] == VISTA_LIVER and labels["spleen"] == VISTA_SPLEEN and labels["airway"] == 132
        assert models[name]["warm"] is True and models[name]["compiled"] is True


@pytest.mark.parametrize("image_id", ["phantom_test0", LPS_SPEC.name])
def test_ohif_click_gives_a_mask_on_the_image_grid_only_around_the_click(server, sample_env, image_id):
    click = central_voxel(sample_env.truth(image_id) == phantom.ORGAN_LABELS["spleen"])
    mask, labels = infer(server, "vista3d", image_id,
                         {"points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]})
    same_grid(mask, sample_env.image_path(image_id))
    assert labels.dtype == np.uint8
    assert set(np.unique(labels)) <= {0, VISTA_SPLEEN}
    assert (labels == VISTA_SPLEEN).any()  # an empty mask would make the next check vacuous
    far = far_from(click, mask.GetSpacing(), labels.shape)
    assert far.any() and not labels[far].any(), "point mode must run only the window around the click"


def test_repeated_ohif_click_with_a_class_reuses_the_encoder(server, sample_env):
    click = central_voxel(sample_env.truth("phantom_test1") == phantom.ORGAN_LABELS["spleen"])
    params = {"points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]}
    _, first_labels = infer(server, "vista3d", "phantom_test1", params)
    first = model_info(server)["embedding_cache"]
    _, again = infer(server, "vista3d", "phantom_test1", params)
    second = model_info(server)["embedding_cache"]
    # per window: the encoder's output, the class head's map, the point head's downsampled features
    assert second["hits"] == first["hits"] + 3 and second["misses"] == first["misses"], "repeat: none of them run"
    assert np.array_equal(again, first_labels)


def test_slicer_clicks_give_a_binary_mask_around_the_clicks_and_reuse_the_encoder(server, sample_env):
    truth = sample_env.truth(LPS_SPEC.name)
    fg = central_voxel(truth == phantom.ORGAN_LABELS["spleen"])
    bg = central_voxel(truth == phantom.ORGAN_LABELS["liver"])
    params = {"label": "spleen", "foreground": [fg], "background": [bg], "client_id": "user-xyz"}
    before = model_info(server, "vista3d_slicer")["embedding_cache"]
    mask, labels = infer(server, "vista3d_slicer", LPS_SPEC.name, params)
    same_grid(mask, sample_env.image_path(LPS_SPEC.name))
    assert set(np.unique(labels)) <= {0, 1}, "Slicer files voxel value 1 under the segment it asked for"
    spacing = mask.GetSpacing()
    assert not labels[far_from(fg, spacing, labels.shape) & far_from(bg, spacing, labels.shape)].any()
    first = model_info(server, "vista3d_slicer")["embedding_cache"]
    # OHIF's click on this spleen above may have encoded its window already: both viewers share the network's cache
    # one window per click, three outputs kept per window (Slicer's clicks come with the segment's class)
    assert first["misses"] + first["hits"] == before["misses"] + before["hits"] + 6, "one window per click"
    _, again = infer(server, "vista3d_slicer", LPS_SPEC.name, params)
    second = model_info(server, "vista3d_slicer")["embedding_cache"]
    assert second["hits"] == first["hits"] + 6 and second["misses"] == first["misses"], "repeat: none of them run"
    assert np.array_equal(again, labels)


def test_class_prompt_and_everything_answer_with_vista_class_ids(server, sample_env, small_study):
    everything = set(range(1, 133)) - {2, 16, 18, 20, 21, 23, 24, 25, 26, 27, 128, 129, 130, 131, 132}
    mask, one = infer(server, "vista3d", small_study, {"label_prompt": [VISTA_SPLEEN]})
    same_grid(mask, sample_env.image_path(small_study))
    assert set(np.unique(one)) == {0, VISTA_SPLEEN}
    _, several = infer(server, "vista3d", small_study, {"label_prompt": [VISTA_SPLEEN, VISTA_LIVER, "aorta"]})
    assert set(np.unique(several)) - {0} <= {VISTA_SPLEEN, VISTA_LIVER, 6} and len(np.unique(several)) > 1
    _, kidneys = infer(server, "vista3d", small_study, {"label_prompt": [VISTA_KIDNEY]})
    assert set(np.unique(kidneys)) <= {0, 5, 14}, "'kidney' is the bundle's shorthand for right and left kidney"
    mask, everything_mask = infer(server, "vista3d", small_study, {})
    values = set(np.unique(everything_mask)) - {0}
    assert values and values <= everything


@pytest.mark.parametrize(
    "model, params, reason",
    [
        ("vista3d", {"points": [[10, 10, 10], [12, 10, 10]], "point_labels": [1]}, "differ in length"),
        ("vista3d", {"points": [[10, 10, 10]]}, "need point_labels"),
        ("vista3d", {"points": [[10, 10, 10]], "point_labels": [7]}, "1 (foreground) or 0 (background)"),
        ("vista3d", {"label_prompt": [200]}, "out of range"),
        ("vista3d", {"label_prompt": [0]}, "out of range"),
        ("vista3d", {"label_prompt": ["no such organ"]}, "neither a vista3d class id nor a label name"),
        ("vista3d", {"points": [[500, 10, 10]], "point_labels": [1], "label_prompt": [3]}, "outside the image"),
        ("vista3d", {"points": [[-1, 10, 10]], "point_labels": [1]}, "outside the image"),
        ("vista3d", {"points": [[1, 2]], "point_labels": [1]}, "three voxel coordinates"),
        ("vista3d", {"points": [[10, 10, 10]], "point_labels": [1], "label_prompt": [3, 1]}, "one class at a time"),
        ("vista3d", {"points": [[10, 10, 10]], "point_labels": [1], "label_prompt": [2]}, "stands for 2 classes"),
        ("vista3d_slicer", {"foreground": [[10, 10, 10]]}, "name the structure to segment in 'label'"),
        ("vista3d_slicer", {"label": "Segment_1", "foreground": [[10, 10, 10]]}, "unknown label 'segment_1'"),
        ("vista3d_slicer", {"label": "spleen", "foreground": [], "background": []}, "no clicks"),
    ],
)
def test_bad_prompts_get_a_clear_4xx_and_the_server_keeps_serving(server, model, params, reason):
    r = _post(server, model, "phantom_test0", params)
    assert r.status_code == 422, r.text
    assert reason.lower() in r.json()["detail"].lower()
    assert requests.get(f"{server}/info/").status_code == 200


def test_repeated_clicks_hit_the_image_cache_and_never_recompile(server, sample_env, small_study):
    wait_all_warm(server)  # the graph count is the process's: background warm-ups must be done
    graphs_before = model_info(server)["compiled_graphs"]
    hits_before = model_info(server)["image_cache"]["hits"]
    requests_made = 0
    for image_id in ["phantom_test1", LPS_SPEC.name, "phantom_test1", small_study, LPS_SPEC.name]:
        truth = sample_env.truth(image_id)
        spleen = central_voxel(truth == phantom.ORGAN_LABELS["spleen"])
        kidney = central_voxel(truth == phantom.ORGAN_LABELS["left_kidney"])
        for params in ({"points": [spleen], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]},
                       {"points": [spleen, kidney], "point_labels": [1, 0], "label_prompt": [VISTA_SPLEEN]},
                       # a click count the warm-up never sent: the point transformer's shapes are dynamic
                       {"points": [spleen, kidney, spleen], "point_labels": [1, 0, 1], "label_prompt": [VISTA_SPLEEN]},
                       {"points": [kidney], "point_labels": [1]}):
            infer(server, "vista3d", image_id, params)
            requests_made += 1
    infer(server, "vista3d", small_study, {"label_prompt": [VISTA_LIVER, VISTA_SPLEEN]})
    assert model_info(server)["compiled_graphs"] == graphs_before, "a prompt compiled a new graph"
    # four requests per image visit; only a first visit of an image (at most three here) may load it
    assert model_info(server)["image_cache"]["hits"] >= hits_before + requests_made + 1 - 3


# The committed tiny weights measured 0.92-0.97 on the test phantoms, RAS and LPS (docs/benchmarks.md); the issue asks
# for 0.8. Phantom-trained samples, not clinical models. Last in the module: its clicks fill the encoder cache that
# the tests above count misses of.
MIN_SPLEEN_CLICK_DICE = 0.8


@pytest.mark.parametrize("image_id", ["phantom_test0", LPS_SPEC.name])
@pytest.mark.parametrize("viewer", ["ohif", "slicer"])
def test_one_click_in_the_spleen_gives_the_spleen(server, sample_env, image_id, viewer):
    truth = sample_env.truth(image_id) == phantom.ORGAN_LABELS["spleen"]
    click = central_voxel(truth)
    if viewer == "ohif":
        _, labels = infer(server, "vista3d", image_id,
                          {"points": [click], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]})
        mask = labels == VISTA_SPLEEN
    else:
        _, labels = infer(server, "vista3d_slicer", image_id,
                          {"label": "spleen", "foreground": [click], "background": []})
        mask = labels == 1
    score = dice(mask, truth)
    print(f"\n{viewer} click in the spleen of {image_id}: Dice {score:.3f}")
    assert score >= MIN_SPLEEN_CLICK_DICE
