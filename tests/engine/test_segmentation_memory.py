"""What keeps a whole-body segmentation within memory: the stitching precision and the skipped softmax, checked
against the bundle's own fp32 path on the tiny samples (CPU). GPU peak memory is measured by `scripts/bench_batch.py`."""

from __future__ import annotations

import pytest
import torch
from monai.transforms import Compose

from rocm_zoo.samples import phantom
from rocm_zoo.engine.overlay import (OVERLAYS_DIR, STITCH_DTYPES, bundle_on_path, load_config, load_weights, overlay_path,
                                     read_settings)
from rocm_zoo.registry import BUNDLES
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.samples.phantom_tensor import as_loaded, loaders_without_reader, without_loaders
from rocm_zoo.server.tasks.segmentation import without_softmax_before_argmax

OVERLAYS = OVERLAYS_DIR
WHOLEBODY = "wholeBody_ct_segmentation"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    for name in (WHOLEBODY, "swin_unetr_btcv_segmentation", "pancreas_ct_dints_segmentation"):
        write_sample_bundle(root, name, "tiny")
    return root


def _parser(model_dir, bundle):
    parser = load_config(model_dir / bundle, BUNDLES[bundle].config, (overlay_path(OVERLAYS, bundle),))
    parser["device"] = "cpu"
    loaders_without_reader(parser)
    return parser


def _post(model_dir, bundle) -> list:
    with bundle_on_path(model_dir / bundle):
        return list(_parser(model_dir, bundle).get_parsed_content("postprocessing").transforms)


def test_softmax_is_skipped_only_where_an_argmax_follows_it(model_dir):
    whole = _post(model_dir, WHOLEBODY)
    kept = without_softmax_before_argmax(whole)
    assert [type(t).__name__ for t in whole[:2]] == ["Activationsd", "AsDiscreted"]
    assert kept == whole[1:]
    # swin and DiNTS invert the probabilities (interpolating them) before their argmax: the softmax must stay.
    for bundle in ("swin_unetr_btcv_segmentation", "pancreas_ct_dints_segmentation"):
        post = _post(model_dir, bundle)
        assert type(post[0]).__name__ == "Activationsd"
        assert without_softmax_before_argmax(post) == post


def test_wholebody_overlay_stitches_in_float16_and_keeps_the_argmax(model_dir):
    parser = _parser(model_dir, WHOLEBODY)
    assert read_settings(parser).stitch_dtype == "float16"
    bundle = model_dir / WHOLEBODY
    with bundle_on_path(bundle):
        network = parser.get_parsed_content("network_def").eval()
        load_weights(network, bundle / BUNDLES[WHOLEBODY].weights)
        pre = Compose(without_loaders(parser.get_parsed_content("preprocessing").transforms))
        inferer = parser.get_parsed_content("inferer")
    p = phantom.make_phantom(phantom.test_specs(1)[0])
    x = pre({"image": as_loaded(p)})["image"].as_tensor()[None]

    def net(w):  # what the pool hands the network: fp32, whatever the stitching dtype
        return network(w.float())

    with torch.no_grad():
        fp32 = inferer(x, net)
        fp16 = inferer(x.to(STITCH_DTYPES["float16"]), net)
    assert fp16.dtype == torch.float16  # the stitching buffer, the largest allocation, is half the size
    agree = (fp32.argmax(1) == fp16.argmax(1)).float().mean().item()
    print(f"float16 vs float32 stitching, argmax agreement over {tuple(x.shape[2:])} voxels: {agree:.5f}")
    # Untrained weights: 105 nearly tied scores per voxel, the hardest case for any rounding.
    assert agree >= 0.995
