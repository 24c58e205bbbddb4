"""The warm pool: one network per explicit key, weights loaded strictly, the network rebuilt when its weights file
changes (and only then), warmed once per shape."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from rocm_zoo.engine.pool import NetworkPool, NetworkSpec, PoolKey, build_network

NETWORK_DEF = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 2, "kernel_size": 1}


def write_weights(bundle, seed: int, bump_s: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    module = nn.Conv3d(1, 2, 1)
    path = bundle / "models" / "model.pt"
    old = path.stat().st_mtime if path.exists() else None
    torch.save(module.state_dict(), path)
    if old is not None:  # a filesystem with coarse timestamps must still see a new file
        os.utime(path, (old + bump_s, old + bump_s))
    return module.eval()


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "toy_bundle"
    (root / "configs").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "configs" / "inference.json").write_text(json.dumps({"network_def": NETWORK_DEF}))
    write_weights(root, seed=1)
    return root


def spec(bundle, overlays=()) -> NetworkSpec:
    return NetworkSpec(bundle, "configs/inference.json", "models/model.pt", tuple(overlays), "cpu")


def test_the_key_names_bundle_device_dtype_layout_and_compile_mode(bundle, tmp_path):
    assert build_network(spec(bundle)).key == PoolKey("toy_bundle", "cpu", "float32", "contiguous", "eager", False)
    overlay = tmp_path / "overlay.json"
    overlay.write_text(json.dumps({"rocm_overlay": {"memory_format": "channels_last_3d", "amp_dtype": "bfloat16"}}))
    key = build_network(spec(bundle, [overlay])).key
    assert (key.memory_format, key.compile_mode) == ("channels_last_3d", "eager")
    assert key.dtype in ("bfloat16", "float32")  # float32 where this CPU has no bf16 (the backend says why)


def test_one_network_per_spec_and_device_spelling(bundle):
    pool = NetworkPool()
    net = pool.get(spec(bundle))
    assert pool.get(NetworkSpec(bundle, "configs/inference.json", "models/model.pt", (), "cpu")) is net
    assert pool.peek(spec(bundle)) is net and pool.networks() == [net]
    assert NetworkPool().peek(spec(bundle)) is None  # peek never builds
    # Served weights need no grad: autocast then caches no casts of them (its process-wide cache, cleared at every
    # autocast exit, deadlocked a batch study against a compile traced in another thread).
    assert not any(p.requires_grad for p in net.eager.parameters())


def test_weights_load_strictly(bundle):
    torch.save({"weight": torch.zeros(2, 1, 1, 1, 1)}, bundle / "models" / "model.pt")  # no bias
    with pytest.raises(RuntimeError, match="Missing key.*bias"):
        NetworkPool().get(spec(bundle))
    torch.save({"model": nn.Conv3d(1, 3, 1).state_dict()}, bundle / "models" / "model.pt")  # wrong shapes
    with pytest.raises(RuntimeError, match="size mismatch"):
        NetworkPool().get(spec(bundle))


def test_new_weights_are_served_and_unchanged_weights_are_not_reloaded(bundle):
    pool = NetworkPool()
    x = torch.rand(1, 1, 4, 4, 4)
    first = pool.get(spec(bundle), [(1, 1, 4, 4, 4)])
    assert first.warmed_shapes == [(1, 1, 4, 4, 4)]
    with torch.no_grad():
        assert torch.allclose(first(x), first.eager(x), atol=1e-6)
    assert pool.get(spec(bundle), [(1, 1, 4, 4, 4)]) is first  # same file: no rebuild, no second warm-up

    new = write_weights(bundle, seed=2, bump_s=2.0)
    second = pool.get(spec(bundle), [(1, 1, 4, 4, 4)])
    assert second is not first and second.warmed_shapes == [(1, 1, 4, 4, 4)]
    with torch.no_grad():
        expected = new(x)
        assert torch.allclose(second(x), expected, atol=1e-6)
        assert not torch.allclose(first(x), expected, atol=1e-3), "seed 2's weights should differ from seed 1's"
    assert pool.peek(spec(bundle)) is second
