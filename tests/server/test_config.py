"""Tests for `--conf` parsing (config, registry), the overlay settings block, and the error classes."""

from __future__ import annotations

import json

import pytest

from rocm_zoo import errors, registry
from rocm_zoo.app.config import AppConfig
from rocm_zoo.engine.overlay import OVERLAYS_DIR, OverlaySettings
from rocm_zoo.errors import ConfigError
from rocm_zoo.registry import MODELS, select_models

SPLEEN_OVERLAY = OVERLAYS_DIR / "spleen_deepedit_annotation/inference_rocm.json"


# --- registry -------------------------------------------------------------------------------------------------------


def test_registry_is_consistent():
    assert MODELS, "the registry serves no model"
    assert len(set(MODELS)) == len(MODELS)
    for task in registry.TASKS.values():
        assert task.model in MODELS
        assert task.bundle in registry.BUNDLES
    for model in MODELS:
        assert registry.tasks_of(model)


def test_all_selects_every_model():
    assert select_models("all") == MODELS
    assert select_models(" all ") == MODELS


def test_comma_list_with_spaces_is_parsed_and_deduplicated():
    first = MODELS[0]
    assert select_models(f" {first} , {first},") == (first,)
    assert select_models(",".join(reversed(MODELS))) == tuple(reversed(MODELS))


def test_unknown_model_is_an_error_naming_the_near_miss():
    assert "spleen_deepedit" in MODELS
    with pytest.raises(ConfigError, match="Did you mean 'spleen_deepedit'") as exc:
        select_models("spleen_deepedt")
    assert "spleen_deepedt" in str(exc.value)


def test_unknown_model_far_from_any_name_lists_the_known_models():
    with pytest.raises(ConfigError) as exc:
        select_models("xyz")
    assert "Did you mean" not in str(exc.value)
    assert "all" in str(exc.value) and MODELS[0] in str(exc.value)


def test_unknown_model_in_a_list_is_an_error_even_next_to_a_good_one():
    with pytest.raises(ConfigError, match="spleen_deepedt"):
        select_models("spleen_deepedit,spleen_deepedt")


@pytest.mark.parametrize("spec", ["", "   ", ",", " , ,"])
def test_empty_model_spec_is_an_error(spec):
    with pytest.raises(ConfigError, match="empty"):
        select_models(spec)


# --- AppConfig.from_conf --------------------------------------------------------------------------------------------


def test_from_conf_defaults():
    cfg = AppConfig.from_conf({})
    assert cfg == AppConfig(models=MODELS, device="auto", warmup=True, image_cache_gb=4.0)


def test_from_conf_reads_every_key():
    cfg = AppConfig.from_conf(
        {"models": "spleen_deepedit", "device": "cuda:1", "warmup": "off", "image_cache_gb": "0.5",
         "interactive_stream": "false", "gc_freeze": "false", "switch_interval_ms": "0.5"}
    )
    assert cfg == AppConfig(models=("spleen_deepedit",), device="cuda:1", warmup=False, image_cache_gb=0.5,
                            interactive_stream=False, gc_freeze=False, switch_interval_ms=0.5)
    with pytest.raises(ConfigError, match="switch_interval_ms takes a number > 0"):
        AppConfig.from_conf({"switch_interval_ms": "0"})


def test_from_conf_unknown_key_suggests_the_near_miss():
    with pytest.raises(ConfigError, match="Did you mean 'models'") as exc:
        AppConfig.from_conf({"model": "all"})
    assert "'model'" in str(exc.value)


def test_from_conf_accepts_monai_labels_own_server_mode_key():
    cfg = AppConfig.from_conf({"server_mode": "true"})
    assert cfg.models == MODELS


@pytest.mark.parametrize("text, expected", [("true", True), ("Yes", True), (" 1 ", True), ("ON", True),
                                            ("false", False), ("no", False), ("0", False), ("Off", False)])
def test_from_conf_warmup_bool_spellings(text, expected):
    assert AppConfig.from_conf({"warmup": text}).warmup is expected


def test_from_conf_bad_bool_names_the_key():
    with pytest.raises(ConfigError, match="warmup") as exc:
        AppConfig.from_conf({"warmup": "maybe"})
    assert "maybe" in str(exc.value)


def test_from_conf_bad_number_names_the_key():
    with pytest.raises(ConfigError, match="image_cache_gb") as exc:
        AppConfig.from_conf({"image_cache_gb": "lots"})
    assert "lots" in str(exc.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_from_conf_image_cache_must_be_a_finite_non_negative_number(value):
    with pytest.raises(ConfigError, match="image_cache_gb"):
        AppConfig.from_conf({"image_cache_gb": value})


def test_from_conf_bad_models_value_is_a_config_error():
    with pytest.raises(ConfigError, match="Did you mean 'spleen_deepedit'"):
        AppConfig.from_conf({"models": "spleen_deepedt"})


# --- OverlaySettings ------------------------------------------------------------------------------------------------


def test_overlay_settings_empty_dict_is_the_baseline():
    assert OverlaySettings.from_dict({}) == OverlaySettings()
    assert OverlaySettings() == OverlaySettings(memory_format="contiguous", amp_dtype="float32", compile=False,
                                                compile_mode=None, gemm_transpose=False)


def test_overlay_settings_unknown_key_suggests_the_near_miss():
    with pytest.raises(ConfigError, match="Did you mean 'amp_dtype'") as exc:
        OverlaySettings.from_dict({"amp_dtyp": "bfloat16"})
    assert "rocm_overlay" in str(exc.value)


def test_overlay_settings_bad_memory_format_is_rejected():
    with pytest.raises(ConfigError, match="memory_format") as exc:
        OverlaySettings.from_dict({"memory_format": "channels_last"})
    assert "channels_last_3d" in str(exc.value)  # the message lists the accepted values


def test_overlay_settings_bad_amp_dtype_is_rejected():
    with pytest.raises(ConfigError, match="amp_dtype") as exc:
        OverlaySettings.from_dict({"amp_dtype": "bf16"})
    assert "bfloat16" in str(exc.value)


@pytest.mark.parametrize("flag", ["compile", "gemm_transpose"])
def test_overlay_flags_must_be_json_booleans(flag):
    # the string "false" is truthy in Python: accepting it would turn on what the overlay meant to turn off
    with pytest.raises(ConfigError, match=flag):
        OverlaySettings.from_dict({flag: "false"})


def test_overlay_compile_mode_must_be_null_or_a_name():
    assert OverlaySettings.from_dict({"compile_mode": "max-autotune"}).compile_mode == "max-autotune"
    with pytest.raises(ConfigError, match="compile_mode"):
        OverlaySettings.from_dict({"compile_mode": 3})


def test_spleen_overlay_file_parses_to_the_expected_settings():
    raw = json.loads(SPLEEN_OVERLAY.read_text())
    settings = OverlaySettings.from_dict(raw["rocm_overlay"])
    assert settings == OverlaySettings(
        memory_format="channels_last_3d", amp_dtype="bfloat16", compile=True, gemm_transpose=True
    )
    assert settings.compile_mode is None


# --- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, status", [(errors.ConfigError, 400), (errors.InvalidRequest, 422),
                                         (errors.ImageNotFound, 404), (errors.ModelNotFound, 404),
                                         (errors.BundleNotFound, 404), (errors.RocmZooError, 500)])
def test_each_error_class_has_its_http_status(cls, status):
    assert cls.status == status
    assert cls("x").status == status
    assert issubclass(cls, errors.RocmZooError)


def test_value_errors_are_still_value_errors():
    # Callers that catch ValueError (e.g. around config parsing) keep working.
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.InvalidRequest, ValueError)


# --- Ray batch engine -----------------------------------------------------------------------------------------------
def test_pacs_timeouts_are_read_and_checked():
    cfg = AppConfig.from_conf({})
    assert (cfg.pacs_connect_timeout_s, cfg.pacs_read_timeout_s) == (5.0, 60.0)
    cfg = AppConfig.from_conf({"pacs_connect_timeout_s": "0.5", "pacs_read_timeout_s": "2"})
    assert (cfg.pacs_connect_timeout_s, cfg.pacs_read_timeout_s) == (0.5, 2.0)
    for bad in ("0", "-1", "inf", "soon"):
        with pytest.raises(ConfigError, match="pacs_read_timeout_s"):
            AppConfig.from_conf({"pacs_read_timeout_s": bad})
    with pytest.raises(ConfigError, match="Did you mean 'pacs_read_timeout_s'"):
        AppConfig.from_conf({"pacs_read_timeout": "2"})


def test_volume_budget_keys_default_to_a_1024x1024x2000_ct_and_are_checked():
    cfg = AppConfig.from_conf({})
    assert cfg.max_volume_voxels >= 1024 * 1024 * 2000 and cfg.max_volume_gb * 1e9 >= 1024 * 1024 * 2000 * 4
    cfg = AppConfig.from_conf({"max_volume_voxels": "2e8", "max_volume_gb": "0.5"})
    assert (cfg.max_volume_voxels, cfg.max_volume_gb) == (200_000_000, 0.5)
    for bad in ("0", "-1", "inf", "big"):
        with pytest.raises(ConfigError, match="max_volume_voxels"):
            AppConfig.from_conf({"max_volume_voxels": bad})
    with pytest.raises(ConfigError, match="Did you mean 'max_volume_gb'"):
        AppConfig.from_conf({"max_volume_gib": "2"})


def test_ray_batch_conf_is_checked():
    conf = AppConfig.from_conf({"batch_engine": "ray", "ray_address": "10.0.0.1:6379", "ray_workers": "2"})
    assert (conf.batch_engine, conf.ray_address, conf.ray_workers) == ("ray", "10.0.0.1:6379", 2)
    with pytest.raises(ConfigError, match="inprocess, ray"):
        AppConfig.from_conf({"batch_engine": "dask"})
    with pytest.raises(ConfigError, match="whole number"):
        AppConfig.from_conf({"ray_workers": "-1"})


def test_without_ray_the_batch_says_how_to_install_it(monkeypatch):
    from rocm_zoo.scale import ray_pool

    monkeypatch.setattr(ray_pool.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        ray_pool.connect()


# --- the uncertainty strategy's keys --------------------------------------------------------------------------------


def test_uncertainty_keys_default_and_parse():
    cfg = AppConfig.from_conf({})
    assert (cfg.uncertainty_model, cfg.uncertainty_flips, cfg.uncertainty_max_new) == ("", 2, 8)
    cfg = AppConfig.from_conf({"uncertainty_model": "wholeBody_ct", "uncertainty_flips": "7",
                               "uncertainty_max_new": "1"})
    assert (cfg.uncertainty_model, cfg.uncertainty_flips, cfg.uncertainty_max_new) == ("wholeBody_ct", 7, 1)


@pytest.mark.parametrize("conf, expected", [
    ({"uncertainty_model": "wholeBody"}, "Did you mean 'wholeBody_ct'"),
    ({"uncertainty_model": "spleen_deepedit"}, "automatic segmentation model"),  # interactive
    ({"uncertainty_model": "wholeBody_ct", "models": "spleen_deepedit"}, "add wholeBody_ct to --conf models"),
    ({"uncertainty_flips": "0"}, "uncertainty_flips takes a whole number 1 to 7"),
    ({"uncertainty_flips": "8"}, "1 to 7"),
    ({"uncertainty_max_new": "0"}, "uncertainty_max_new takes a whole number >= 1"),
    ({"uncertainty_max_new": "many"}, ">= 1, not 'many'"),
])
def test_uncertainty_keys_are_checked(conf, expected):
    with pytest.raises(ConfigError, match=expected):
        AppConfig.from_conf(conf)


def test_allowed_hosts():
    assert AppConfig.from_conf({}).allowed_hosts == ()
    c = AppConfig.from_conf({"allowed_hosts": "Gateway.Hospital.example., 10.0.0.7,gateway.hospital.example"})
    assert c.allowed_hosts == ("gateway.hospital.example", "10.0.0.7")
    for bad in ("*", "http://x.example", "x.example:8000", "a..b", "-x"):
        with pytest.raises(ConfigError, match="allowed_hosts"):
            AppConfig.from_conf({"allowed_hosts": bad})
