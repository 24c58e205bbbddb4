"""The sliding-window bundles (wholeBody_ct, swin_unetr_btcv, pancreas_ct_dints) through a real MONAI Label server:
warm in the background while the server already answers, one compiled graph per network whatever the volume size."""

from __future__ import annotations

import tempfile
import time

import numpy as np
import pytest
import requests
import SimpleITK as sitk
from monailabel.client import MONAILabelClient

from zoo_test_support import LPS_SPEC

pytestmark = pytest.mark.slow

BATCH_MODELS = ("wholeBody_ct", "swin_unetr_btcv", "pancreas_ct_dints")
# Volumes of different sizes, spacings and orientations: each resamples to a different grid, so the sliding window
# sees different volume shapes; its window batches must not.
IMAGES = ("phantom_test0", "phantom_test1", LPS_SPEC.name)


def segment(server: str, model: str, image_id: str) -> tuple[sitk.Image, dict]:
    with tempfile.TemporaryDirectory() as tmpdir:
        result, params = MONAILabelClient(server, tmpdir=tmpdir).infer(model, image_id, {"result_extension": ".nrrd"})
        return sitk.ReadImage(result), params


def models_info(server: str) -> dict:
    return requests.get(f"{server}/info/").json()["models"]


def wait_all_warm(server: str, timeout_s: float = 900) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        warm = requests.get(f"{server}/info/").json()["rocm_zoo"]["warm"]
        if all(state.startswith(("warm", "failed")) for state in warm.values()):
            return warm
        time.sleep(2)
    pytest.fail(f"models still warming after {timeout_s} s: {warm}")


def test_interactive_models_are_warm_when_the_server_answers(server):
    warm = requests.get(f"{server}/info/").json()["rocm_zoo"]["warm"]
    assert set(BATCH_MODELS) <= set(warm)
    assert warm["spleen_deepedit"].startswith("warm"), warm
    for model in BATCH_MODELS:
        assert warm[model].split()[0] in {"pending", "warming", "warm"}, warm[model]


@pytest.mark.parametrize("model", BATCH_MODELS)
def test_batch_model_answers_while_it_may_still_be_warming(server, sample_env, model):
    # Right after start-up the model may still warm in the background: the request waits for that warm-up (one
    # build per network) and gets a label with the input image's geometry.
    mask, _ = segment(server, model, IMAGES[0])
    image = sitk.ReadImage(str(sample_env.image_path(IMAGES[0])))
    assert mask.GetSize() == image.GetSize()


def test_no_model_recompiles_for_other_volume_sizes(server, sample_env):
    warm = wait_all_warm(server)
    assert all(state.startswith("warm") for state in warm.values()), warm
    graphs = models_info(server)[BATCH_MODELS[0]]["compiled_graphs"]  # process-wide: every network's graphs
    for model in BATCH_MODELS:
        known = {int(v) for v in models_info(server)[model]["labels"].values()} | {0}
        for image_id in IMAGES:
            mask, _ = segment(server, model, image_id)
            image = sitk.ReadImage(str(sample_env.image_path(image_id)))
            assert mask.GetSize() == image.GetSize()
            assert np.allclose(mask.GetSpacing(), image.GetSpacing())
            assert np.allclose(mask.GetDirection(), image.GetDirection())
            labels = set(np.unique(sitk.GetArrayFromImage(mask)).tolist())
            assert labels <= known, f"{model} wrote labels {labels - known} it does not declare"
    info = models_info(server)
    for model in BATCH_MODELS:
        assert info[model]["warm"] is True and info[model]["compiled"] is True
        assert len(info[model]["warmed_shapes"]) == 1, info[model]["warmed_shapes"]
    # Nine requests over three volume sizes later, the process holds the graphs it had once warm: no recompiles.
    assert info[BATCH_MODELS[0]]["compiled_graphs"] == graphs
