"""VISTA3D's click windows stitched on the image's device give MONAI's logits to the value, the bundle's inferer is
routed to them, and a predictor's forwards keep the allocator's cache."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from monai.apps.vista3d import inferer as monai_inferer

from rocm_zoo.engine import scheduler
from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.samples.bundles import vista3d, write_sample_bundle
from rocm_zoo.vista3d import predictor as vista_predictor
from rocm_zoo.vista3d import reroutes
from rocm_zoo.vista3d import window as vista_window
from zoo_test_support import EagerNetwork

ROI = [16, 16, 16]


def window_dependent(x, point_coords, point_labels, class_vector, prompt_class, patch_coords, prev_mask, **kwargs):
    """Logits that depend on the window's image and its place, so a misplaced or dropped window changes the sum."""
    start = sum(s.start for s in patch_coords[0][2:])
    channels = 1 if class_vector is None else len(class_vector)
    return torch.cat([x * (c + 1.5) - start / 7 for c in range(channels)], dim=1)


CASES = {
    "one click": dict(shape=(40, 30, 24), points=[[20.0, 10.3, 12.7]]),
    "overlapping windows are summed": dict(shape=(40, 30, 24), points=[[10.0, 10.0, 10.0], [17.6, 14.2, 9.0]]),
    "click near the border": dict(shape=(40, 30, 24), points=[[39.0, 0.0, 23.0]]),
    "image smaller than the window is padded": dict(shape=(12, 30, 9), points=[[5.0, 20.0, 4.4]]),
    "three windows per click": dict(shape=(40, 30, 24), points=[[20.0, 15.0, 12.0]], center_only=False),
    "two classes": dict(shape=(40, 30, 24), points=[[20.0, 15.0, 12.0]], class_vector=torch.tensor([[3], [5]])),
    "previous mask fills the rest": dict(shape=(40, 30, 24), points=[[20.0, 15.0, 12.0]], prev_mask=True),
    "points from the second on": dict(shape=(40, 30, 24), points=[[3.0, 3.0, 3.0], [30.0, 20.0, 15.0]],
                                      point_start=1),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_same_logits_as_monai(case):
    case = dict(case)
    g = torch.Generator().manual_seed(0)
    image = torch.rand(1, 1, *case.pop("shape"), generator=g)
    points = torch.tensor([case.pop("points")])
    kwargs = dict(point_coords=points, point_labels=torch.ones(points.shape[:2], dtype=torch.long), **case)
    if kwargs.get("prev_mask"):
        kwargs["prev_mask"] = torch.rand(1, 1, *image.shape[2:], generator=g)
    ours = vista_window.point_based_window_inferer(image, ROI, window_dependent, **kwargs)
    monai = monai_inferer.point_based_window_inferer(image.clone(), ROI, window_dependent, **kwargs)
    assert ours.shape == monai.shape
    assert torch.isnan(monai).any() == ("prev_mask" not in case)
    torch.testing.assert_close(ours.as_tensor(), monai.as_tensor(), rtol=0, atol=0, equal_nan=True)


def test_the_input_image_is_left_as_it_was():
    image = torch.rand(1, 1, 12, 30, 9)
    before = image.clone()
    vista_window.point_based_window_inferer(image, ROI, window_dependent, point_coords=torch.tensor([[[5.0, 5, 5]]]),
                                            point_labels=torch.tensor([[1]]))
    assert torch.equal(image, before)


def test_install_routes_the_bundle_inferer_module(tmp_path):
    bundle = write_sample_bundle(tmp_path / "model", vista3d, "tiny")
    with bundle_on_path(bundle):
        inferer = load_config(bundle, "configs/inference.json").get_parsed_content("inferer")
    with bundle_on_path(bundle):  # a second task loads the bundle's `scripts` again, the first's leave sys.modules
        pass
    assert type(inferer).__module__ not in sys.modules
    module = type(inferer).__call__.__globals__
    assert module["point_based_window_inferer"] is monai_inferer.point_based_window_inferer
    vista_window.route_inferer(inferer)
    vista_window.route_inferer(inferer)
    assert module["point_based_window_inferer"] is vista_window.point_based_window_inferer
    assert monai_inferer.point_based_window_inferer is not vista_window.point_based_window_inferer  # MONAI's own stays


def test_predictor_forwards_keep_the_allocator_cache(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    torch.manual_seed(0)
    net = EagerNetwork(vista3d.build_network("tiny").eval())
    x = torch.rand(1, 1, 64, 64, 64)
    prompts = dict(class_vector=torch.tensor([[3]]), transpose=True)
    net(x, **prompts)
    assert emptied, "VISTA3D's own forward empties the cache (else this test checks nothing)"
    emptied.clear()
    reroutes.keep_allocator_cache(net)  # as rocm_zoo.vista3d.install does
    vista_predictor.VistaPredictor(net, class_bucket=8)(x, **prompts)
    assert not emptied
    with reroutes.allocator_cache_kept():
        with reroutes.allocator_cache_kept():
            torch.cuda.empty_cache()
        torch.cuda.empty_cache()
    assert not emptied
    torch.cuda.empty_cache()
    assert emptied == [1], "restored after nested use"


class _TurnCountingNetwork:
    """A network that records, per forward, whether its thread held a turn on its device."""

    backend = SimpleNamespace(device="cpu")

    def __init__(self):
        self.eager = torch.nn.Identity()  # what the predictor keys its embedding cache by
        self.in_turn: list[bool] = []

    def after_swap(self, hook) -> None:
        pass

    def __call__(self, x, *args, **kwargs):
        self.in_turn.append("cpu" in scheduler._held.__dict__.get("devices", set()))
        return window_dependent(x, *args, **kwargs)


def test_a_clicks_windows_run_in_one_device_turn():
    # Lower work must not slip in between a click's windows (engine.scheduler): all its windows, one turn.
    net = _TurnCountingNetwork()
    queue = scheduler.device_queue("cpu")
    before = queue.served[Priority.INTERACTIVE]
    with working_as(Work(Priority.INTERACTIVE, "click")):
        vista_window.point_based_window_inferer(torch.rand(1, 1, 40, 30, 24), ROI,
                                                vista_predictor.VistaPredictor(net, class_bucket=8),
                                                point_coords=torch.tensor([[[20.0, 15.0, 12.0]]]),
                                                point_labels=torch.tensor([[1]]), center_only=False)
    assert len(net.in_turn) > 1 and all(net.in_turn)
    assert queue.served[Priority.INTERACTIVE] == before + 1
