"""`rocm_zoo.vista3d.install`: every reroute of MONAI's and the bundle's calls set up in one step, each once however
often it is called, and the network's answer unchanged by it."""

from __future__ import annotations

import pytest
import torch

from rocm_zoo.engine.overlay import bundle_on_path, load_config
from rocm_zoo.samples.bundles import vista3d, write_sample_bundle
from rocm_zoo.vista3d import window as vista_window
from rocm_zoo.vista3d.predictor import CACHED_SUBMODULES, CachingSubmodule, VistaPredictor
import rocm_zoo.vista3d
from zoo_test_support import EagerNetwork


@pytest.fixture
def monai_functions(monkeypatch):
    """MONAI's module attributes that `install` replaces, put back after the test."""
    import monai.apps.vista3d.transforms as vista_transforms
    import monai.networks.nets.vista3d as vista_net

    monkeypatch.setattr(vista_net, "lcc", vista_net.lcc)
    monkeypatch.setattr(vista_transforms, "keep_components_with_positive_points",
                        vista_transforms.keep_components_with_positive_points)
    return vista_net, vista_transforms


def test_install_sets_up_all_four_reroutes_once_and_changes_no_answer(tmp_path, monkeypatch, monai_functions):
    vista_net, vista_transforms = monai_functions
    bundle = write_sample_bundle(tmp_path / "model", vista3d, "tiny")
    with bundle_on_path(bundle):
        inferer = load_config(bundle, "configs/inference.json").get_parsed_content("inferer")
    torch.manual_seed(0)
    net = EagerNetwork(vista3d.build_network("tiny").eval())
    submodules = {path: net.eager.get_submodule(path) for path, *_ in CACHED_SUBMODULES}
    forward = net.eager.forward
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    x = torch.rand(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(4))
    prompts = dict(class_vector=torch.tensor([[3]]), transpose=True)
    before = net(x, **prompts)
    assert emptied, "VISTA3D's own forward empties the cache (else this test checks nothing)"
    emptied.clear()

    rocm_zoo.vista3d.install(net, inferer)
    rocm_zoo.vista3d.install(net, inferer)

    assert vista_net.lcc.rocm_zoo and vista_transforms.keep_components_with_positive_points.rocm_zoo
    module = type(inferer).__call__.__globals__
    assert module["point_based_window_inferer"] is vista_window.point_based_window_inferer
    for path, submodule in submodules.items():
        wrapped = net.eager.get_submodule(path)
        assert isinstance(wrapped, CachingSubmodule) and wrapped.module is submodule, f"{path} is wrapped once"
    assert net.eager.forward.rocm_zoo_keeps_allocator_cache and net.eager.forward.__wrapped__ == forward, \
        "the forward is wrapped once"
    after = net(x, **prompts)
    assert not emptied
    assert torch.equal(after, before)
    torch.cuda.empty_cache()
    assert emptied == [1], "kept only inside the network's forward"


def test_a_click_on_a_network_without_the_reroutes_says_what_to_call():
    torch.manual_seed(0)
    net = EagerNetwork(vista3d.build_network("tiny").eval())
    window = [(slice(None), slice(None), slice(0, 64), slice(0, 64), slice(0, 64))]
    predictor = VistaPredictor(net, class_bucket=8, image_key="image-a")
    with pytest.raises(RuntimeError, match=r"rocm_zoo.vista3d.install\(network, inferer\)"):
        predictor(torch.rand(1, 1, 64, 64, 64), point_coords=torch.tensor([[[3.0, 3.0, 3.0]]]),
                  point_labels=torch.tensor([[1]]), patch_coords=window)
