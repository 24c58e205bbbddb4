"""The tasks without a server: built from the tiny sample bundles as the app builds them, what they check on a request
before any network runs (DeepEdit clicks, VISTA3D prompts and the bundle's prompt rules), the shapes they warm."""

from __future__ import annotations

import pytest
import torch
from monai.data import MetaTensor

from rocm_zoo.engine.image_cache import ImageCache
from rocm_zoo.engine.pool import NetworkPool
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.registry import TASKS
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.server.tasks import make_task
from rocm_zoo.vista3d.prompts import VistaPrompt

SHAPE = (40, 30, 20)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("model")
    for bundle in ("spleen_deepedit_annotation", "vista3d"):
        write_sample_bundle(root, bundle, "tiny")
    return root


def task(model_dir, name: str):
    entry = TASKS[name]
    return make_task(entry, model_dir / entry.bundle, (), NetworkPool(), ImageCache(0), "cpu")


def image_data(task_, **request) -> dict:
    image = MetaTensor(torch.zeros(1, *SHAPE), meta={"spatial_shape": torch.tensor(SHAPE)})
    return {task_.input_key: image, **request}


@pytest.fixture(scope="module")
def deepedit(model_dir):
    return task(model_dir, "spleen_deepedit")


def test_deepedit_accepts_clicks_inside_the_image_per_label(deepedit):
    labels = deepedit.label_names()
    assert "spleen" in labels and "background" in labels
    data = image_data(deepedit, spleen=[[1, 2, 3], [39, 29, 19]], background=[], label_info=[{"a": 1}])
    deepedit.prepare_request(data)
    assert data["spleen"] == [[1, 2, 3], [39, 29, 19]]  # checked, left as sent for the bundle's guidance


@pytest.mark.parametrize("request_, expected", [
    ({"liver": [[1, 2, 3]]}, "Clicks for unknown label 'liver'; model 'spleen_deepedit' knows: .*spleen"),
    ({"spleen": [[1, 2]]}, r"Click \[1, 2\] on 'spleen' is not three voxel coordinates"),
    ({"spleen": [[1, 2, "x"]]}, "is not three voxel coordinates"),
    ({"background": [[0, 0, 20]]}, r"Click \[0, 0, 20\] on 'background' is outside the image.*\[0, 20\)"),
    ({"spleen": [[-0.5, 1, 1]]}, "outside the image"),
])
def test_deepedit_refuses_bad_clicks_with_the_reason(deepedit, request_, expected):
    with pytest.raises(InvalidRequest, match=expected):
        deepedit.prepare_request(image_data(deepedit, **request_))


def test_automatic_deepedit_task_ignores_clicks_but_still_checks_their_label(model_dir):
    seg = task(model_dir, "spleen_deepedit_seg")
    data = image_data(seg, spleen=[[1, 2, 3]], background=[[999, 0, 0]])
    seg.prepare_request(data)
    assert data["spleen"] == [] and data["background"] == []  # zero guidance
    with pytest.raises(InvalidRequest, match="unknown label 'liver'"):
        seg.prepare_request(image_data(seg, liver=[[1, 2, 3]]))


def test_deepedit_warms_one_exact_shape(deepedit):
    channels = deepedit.bundle_config.get_parsed_content("network_def#in_channels")
    spatial = deepedit.bundle_config.get_parsed_content("spatial_size")
    assert deepedit.warm_shapes() == [(1, int(channels), *map(int, spatial))]


@pytest.fixture(scope="module")
def vista(model_dir):
    return task(model_dir, "vista3d"), task(model_dir, "vista3d_slicer")


def test_vista3d_reads_the_form_of_its_client(vista):
    ohif, slicer = vista
    name, class_id = next(iter(ohif.labels.items()))
    assert ohif.parse_prompt({"label_prompt": [class_id]}, SHAPE).classes == (class_id,)
    p = slicer.parse_prompt({"label": name, "foreground": [[1, 1, 1]]}, SHAPE)
    assert p == VistaPrompt((class_id,), ((1.0, 1.0, 1.0),), (1,), binary=True)
    with pytest.raises(InvalidRequest, match="Name the structure"):  # Slicer's form is required of the deepgrow task
        slicer.parse_prompt({"label_prompt": [class_id]}, SHAPE)
    with pytest.raises(InvalidRequest, match="out of range"):
        ohif.parse_prompt({"label_prompt": [max(ohif.labels.values()) + 1]}, SHAPE)


def test_vista3d_nothing_asked_is_the_bundles_everything(vista):
    ohif, _ = vista
    prompt = ohif._apply_bundle_rules(VistaPrompt(None, None, None), [])
    assert prompt.classes == ohif.everything and prompt.points is None
