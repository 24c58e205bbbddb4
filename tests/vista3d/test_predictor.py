"""The VISTA3D predictor changes no answer: padded class prompts give the same maps, cached submodule outputs (encoder,
class head, the point head's downsampling) the same logits; and its embedding cache stays within its byte bound."""

from __future__ import annotations


import pytest
import torch

from rocm_zoo.samples.bundles import vista3d
from rocm_zoo.vista3d.predictor import CACHED_SUBMODULES, EmbeddingCache, VistaPredictor, route_window_caches
from zoo_test_support import EagerNetwork


def _network() -> EagerNetwork:
    torch.manual_seed(0)
    return EagerNetwork(vista3d.build_network("tiny").eval())


def test_padded_class_prompt_gives_the_same_maps():
    net = _network()
    x = torch.rand(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([[3], [1], [6]])
    plain = net(x, class_vector=classes, transpose=True)
    padded = VistaPredictor(net, class_bucket=8)(x, class_vector=classes, transpose=True)
    assert padded.shape == plain.shape == (1, 3, 64, 64, 64)
    assert torch.allclose(padded, plain, atol=1e-5)


def _count_runs(net: EagerNetwork) -> dict[str, list]:
    runs = {}
    for path, *_ in CACHED_SUBMODULES:
        runs[path] = []
        net.eager.get_submodule(path).register_forward_hook(lambda *_, path=path: runs[path].append(1))
    return runs


@pytest.mark.parametrize("with_class", [False, True], ids=["clicks alone (Slicer)", "clicks with a class (OHIF)"])
def test_cached_outputs_give_the_same_logits_and_are_hit_on_the_same_window(with_class):
    net = _network()
    runs = _count_runs(net)
    route_window_caches(net)  # as rocm_zoo.vista3d.install does
    x = torch.rand(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(2))
    window = [(slice(None), slice(None), slice(10, 74), slice(0, 64), slice(5, 69))]
    prompts = dict(point_coords=torch.tensor([[[40.0, 30.0, 30.0]]]), point_labels=torch.tensor([[1]]),
                   patch_coords=window, transpose=True)
    if with_class:
        prompts.update(class_vector=torch.tensor([[3]]), prompt_class=torch.tensor([[3]]))
    uncached = net(x, **prompts)
    predictor = VistaPredictor(net, class_bucket=8, image_key="image-a")
    first = predictor(x, **prompts)
    second = predictor(x, **prompts)
    cached = 3 if with_class else 2  # encoder, point head's downsampling, and the class head when there is a class
    ran = {path: len(r) for path, r in runs.items()}
    assert ran == {"image_encoder": 2, "point_head.feat_downsample": 2, "class_head": 2 if with_class else 0}, \
        "the plain call and the first cached call run each submodule; the repeat runs none"
    assert (predictor.embeddings.misses, predictor.embeddings.hits) == (cached, cached)
    assert torch.equal(first, second) and torch.allclose(first, uncached, atol=1e-6)
    assert net.eager.image_embeddings is None, "the shared module must not keep a request's embedding"
    other_image = VistaPredictor(net, class_bucket=8, image_key="image-b")
    other_image(x, **prompts)
    assert predictor.embeddings.misses == 2 * cached and len(runs["image_encoder"]) == 3, \
        "another image's window is another entry"


def test_a_cached_class_map_is_not_changed_by_the_forward_that_edits_it():
    """VISTA3D's forward edits the class head's logits in place where the clicks change them: a later click on the
    window must start from the class head's own map, not from the edited one."""
    net = _network()
    route_window_caches(net)
    x = torch.rand(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(5))
    window = [(slice(None), slice(None), slice(0, 64), slice(0, 64), slice(0, 64))]
    predictor = VistaPredictor(net, class_bucket=8, image_key="image-a")
    one_class = dict(class_vector=torch.tensor([[3]]), prompt_class=torch.tensor([[3]]), patch_coords=window,
                     transpose=True)
    first, second = torch.tensor([[[20.0, 30.0, 30.0]]]), torch.tensor([[[45.0, 12.0, 50.0]]])
    expected = net(x, point_coords=second, point_labels=torch.tensor([[1]]), **one_class)  # no window: nothing cached
    predictor(x, point_coords=first, point_labels=torch.tensor([[1]]), **one_class)
    got = predictor(x, point_coords=second, point_labels=torch.tensor([[1]]), **one_class)
    assert predictor.embeddings.hits == 3, "the second click took all three outputs from the cache"
    assert torch.allclose(got, expected, atol=1e-6)


def test_whole_volume_prompts_are_not_cached():
    net = _network()
    x = torch.rand(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(3))
    window = [(slice(None), slice(None), slice(0, 64), slice(0, 64), slice(0, 64))]
    predictor = VistaPredictor(net, class_bucket=8, image_key="image-a")
    predictor(x, window, class_vector=torch.tensor([[3]]), transpose=True)
    assert len(predictor.embeddings) == 0


def test_embedding_cache_is_bounded_in_bytes():
    cache = EmbeddingCache(max_bytes=3 * 4 * 100)
    for i in range(5):
        cache.put(i, torch.zeros(100))  # 400 bytes each
    assert len(cache) == 3 and cache.get(0) is None and cache.get(4) is not None
    big = EmbeddingCache(max_bytes=10)
    big.put("only", torch.zeros(100))
    assert len(big) == 1, "the newest entry is kept even over the bound"
