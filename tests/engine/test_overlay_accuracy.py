"""The overlay (bf16 autocast, channels_last_3d, GEMM transpose, torch.compile) against the fp32 eager bundle on the
same input, through the same pool the server uses: the segmentation may only change by what bf16 rounding explains."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from rocm_zoo.samples import phantom
from rocm_zoo.bench.network import dice_per_label
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec, compiled_graphs
from rocm_zoo.registry import BUNDLES
from rocm_zoo.bench.workloads import prepare, workloads_for


pytestmark = pytest.mark.slow
BUNDLE = "spleen_deepedit_annotation"


def test_overlay_matches_fp32_eager_on_a_phantom(sample_env):
    bundle_dir = sample_env.paths.model_dir / BUNDLE
    entry = BUNDLES[BUNDLE]
    overlay = overlay_path(OVERLAYS_DIR, BUNDLE)
    pool = NetworkPool()
    baseline = pool.get(NetworkSpec(bundle_dir, entry.config, entry.weights, (), "cpu"))
    fast = pool.get(NetworkSpec(bundle_dir, entry.config, entry.weights, (overlay,), "cpu"))
    assert baseline.info()["compiled"] is False and baseline.info()["dtype"] == "float32"
    assert fast.info()["compiled"] is True and fast.info()["memory_format"] == "channels_last_3d"
    x = prepare(bundle_dir, workloads_for(BUNDLE)[0], phantom.test_specs()[0]).batch
    ref, out = baseline(x), fast(x)
    graphs = compiled_graphs()
    dice = dice_per_label(out.argmax(1), ref.argmax(1))
    assert dice["1"] >= 0.99, dice
    # bf16 keeps ~3 significant digits; logits of this size agree to a few percent
    assert ((out - ref).norm() / ref.norm()).item() < 0.05
    fast(x)
    assert compiled_graphs() == graphs, "the same input shape must not recompile"


def test_pool_shares_one_network_per_key_and_reloads_new_weights(sample_env, tmp_path):
    bundle_dir = tmp_path / BUNDLE  # a copy: the server under test must not see its weights change
    shutil.copytree(sample_env.paths.model_dir / BUNDLE, bundle_dir)
    entry = BUNDLES[BUNDLE]
    spec = NetworkSpec(bundle_dir, entry.config, entry.weights, (), "cpu")
    pool = NetworkPool()
    a = pool.get(spec)
    assert pool.get(spec) is a
    weights = bundle_dir / entry.weights
    st = weights.stat()
    os.utime(weights, (st.st_atime, st.st_mtime + 10))
    b = pool.get(spec)
    assert b is not a
    assert all(torch.equal(p, q) for p, q in zip(a.eager.state_dict().values(), b.eager.state_dict().values()))
