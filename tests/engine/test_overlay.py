"""The overlay: merged over the bundle config with MONAI's rules, its `rocm_overlay` block read into settings whose
errors name what was expected, and the layout steps applied to a network (or left alone) as the settings say."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from rocm_zoo.engine.overlay import (BASELINE, SETTINGS_KEY, OverlaySettings, compile_network, load_config,
                                     load_weights, prepare_network, read_settings, submodules_to_compile)
from rocm_zoo.errors import ConfigError


def write_json(path, content) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    return str(path)


@pytest.fixture
def bundle(tmp_path):
    write_json(tmp_path / "bundle" / "configs" / "inference.json",
               {"roi": [96, 96, 96], "channels": 2, "transforms": ["load", "scale"], "nested": {"a": 1, "b": 2}})
    return tmp_path / "bundle"


def test_overlays_merge_in_order_later_keys_win_and_plus_appends(bundle, tmp_path):
    first = write_json(tmp_path / "o1.json", {"roi": [64, 64, 64], "+transforms": ["to_device"],
                                              SETTINGS_KEY: {"amp_dtype": "bfloat16"}})
    second = write_json(tmp_path / "o2.json", {"roi": [32, 32, 32], "nested#b": 3})
    parser = load_config(bundle, "configs/inference.json", [first, second])
    assert parser["roi"] == [32, 32, 32]
    assert parser["transforms"] == ["load", "scale", "to_device"]
    assert parser["nested"] == {"a": 1, "b": 3} and parser["channels"] == 2
    assert parser["bundle_root"] == str(bundle)
    assert read_settings(parser) == OverlaySettings(amp_dtype="bfloat16")


def test_no_overlay_is_the_bundle_as_shipped(bundle):
    assert read_settings(load_config(bundle, "configs/inference.json")) is BASELINE
    assert (BASELINE.amp_dtype, BASELINE.memory_format, BASELINE.compile) == ("float32", "contiguous", False)


def test_a_missing_config_file_is_named(bundle, tmp_path):
    with pytest.raises(ConfigError, match="no_such.json does not exist"):
        load_config(bundle, "configs/inference.json", [tmp_path / "no_such.json"])
    with pytest.raises(ConfigError, match="train.json does not exist"):
        load_config(bundle, "configs/train.json")


@pytest.mark.parametrize("block, expected", [
    ({"amp_dtyp": "float16"}, "Unknown key 'amp_dtyp'.*Did you mean 'amp_dtype'"),
    ({"memory_format": "channels_last"}, r"memory_format must be one of \['contiguous', 'channels_last_3d'\]"),
    ({"amp_dtype": "fp16"}, r"amp_dtype must be one of \['float32', 'bfloat16', 'float16'\], not 'fp16'"),
    ({"stitch_dtype": "bfloat16"}, r"stitch_dtype must be one of \['float32', 'float16'\], not 'bfloat16'"),
    ({"compile": "true"}, "'compile' .* must be true or false"),
    ({"gemm_transpose": 1}, "'gemm_transpose' .* must be true or false"),
    ({"cudnn_benchmark": None}, "'cudnn_benchmark' .* must be true or false"),
    ({"compile_mode": 3}, "'compile_mode' must be null or a torch.compile mode name, not 3"),
    ({"compile_submodules": "image_encoder"}, "'compile_submodules' must be null or a list of submodule names"),
    ({"compile_submodules": ["image_encoder", ""]}, "'compile_submodules' must be null or a list"),
    ({"compile_submodules": ["a"], "compile_dynamic": "a"}, "'compile_dynamic' must be a list of submodule names"),
    ({"compile_submodules": ["a"], "compile_dynamic": ["b"]}, r"'compile_dynamic' names \['b'\], which"),
    ({"compile_dynamic": ["a"]}, r"'compile_dynamic' names \['a'\], which 'compile_submodules' does not list"),
])
def test_bad_settings_say_what_was_expected(bundle, tmp_path, block, expected):
    overlay = write_json(tmp_path / "bad.json", {SETTINGS_KEY: block})
    with pytest.raises(ConfigError, match=expected):
        read_settings(load_config(bundle, "configs/inference.json", [overlay]))


def test_settings_read_from_a_block():
    s = OverlaySettings.from_dict({"memory_format": "channels_last_3d", "compile": True, "compile_mode": "max-autotune",
                                   "compile_submodules": ["a", "b.c"], "stitch_dtype": "float16"})
    assert s.compile_submodules == ("a", "b.c") and s.compile_mode == "max-autotune" and s.stitch_dtype == "float16"
    assert s.compile_dynamic == ()
    assert OverlaySettings.from_dict({"compile_submodules": ["a", "b.c"], "compile_dynamic": ["b.c"]}).compile_dynamic \
        == ("b.c",)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.Conv3d(2, 2, 1)).eval()


def test_prepare_network_baseline_leaves_the_layout_alone():
    module = net()
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    out = prepare_network(module, BASELINE, "cpu")
    assert out is module
    assert all(p.is_contiguous() for p in out.parameters())
    assert all(torch.equal(weights[k], v) for k, v in out.state_dict().items())


def test_prepare_network_channels_last_from_the_raw_block_same_output():
    x = torch.rand(1, 1, 6, 6, 6)
    ref = net()(x)
    out = prepare_network(net(), {"memory_format": "channels_last_3d"}, "cpu")
    assert out[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(out(x), ref, atol=1e-6)
    with pytest.raises(ConfigError, match="Unknown key"):  # the raw block is checked like the overlay's
        prepare_network(net(), {"memory_fromat": "contiguous"}, "cpu")


def test_compile_network_only_when_asked_and_names_a_missing_submodule():
    module = net()
    assert compile_network(module, BASELINE) is module and module._compiled_call_impl is None
    assert submodules_to_compile(module, BASELINE) == [("", module)]
    assert submodules_to_compile(module, OverlaySettings(compile_submodules=("1",))) == [("1", module[1])]
    with pytest.raises(ConfigError, match="compile_submodules: .*Sequential"):
        submodules_to_compile(module, OverlaySettings(compile=True, compile_submodules=("image_encoder",)))


def test_load_weights_is_strict_and_reads_a_nested_state_dict(tmp_path):
    source = net()
    torch.save({"model": source.state_dict()}, tmp_path / "nested.pt")
    target = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.Conv3d(2, 2, 1))
    load_weights(target, tmp_path / "nested.pt")
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    partial = {k: v for k, v in source.state_dict().items() if not k.startswith("1.")}
    torch.save(partial, tmp_path / "partial.pt")
    with pytest.raises(RuntimeError, match="Missing key"):
        load_weights(target, tmp_path / "partial.pt")
