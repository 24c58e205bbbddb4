"""The one registry: its own logic, that everything else derives from it, and that adding a bundle is one registry
entry plus one overlay file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from rocm_zoo import registry
from rocm_zoo.errors import BundleNotFound, ConfigError
from rocm_zoo.registry import BUNDLES, MODELS, TASKS, BundleEntry, Request, TaskEntry

from rocm_zoo.engine.overlay import OVERLAYS_DIR

OVERLAYS = OVERLAYS_DIR
NEW_BUNDLE, NEW_TASK = "tiny_ct_segmentation", "tiny_ct"


# -- the registry's own logic ------------------------------------------------------------------------------------------
def test_select_models_all_list_and_errors():
    assert registry.select_models("all") == MODELS
    assert registry.select_models("vista3d, wholeBody_ct,vista3d") == ("vista3d", "wholeBody_ct")
    with pytest.raises(ConfigError, match="empty"):
        registry.select_models(" , ")
    with pytest.raises(ConfigError, match="Did you mean 'vista3d'") as e:
        registry.select_models("vista3")
    assert "Known models: all, " + ", ".join(MODELS) in str(e.value)


def test_tasks_of_a_model_are_its_tasks_in_table_order():
    assert [t.name for t in registry.tasks_of("spleen_deepedit")] == ["spleen_deepedit", "spleen_deepedit_seg"]
    assert [t.name for t in registry.tasks_of("vista3d")] == ["vista3d", "vista3d_slicer"]
    assert registry.tasks_of("nothing") == []
    assert MODELS == ("spleen_deepedit", "vista3d", "wholeBody_ct", "swin_unetr_btcv", "pancreas_ct_dints")


def test_every_bundle_has_requests_tasks_and_known_kinds():
    for name, b in BUNDLES.items():
        assert b.kind in registry.BUNDLE_KINDS, name
        assert any(r.warm for r in b.requests), f"{name}: nothing to warm with"
        assert all(r.kind in registry.REQUEST_KINDS for r in b.requests), name
        assert b.tasks and all(TASKS[t.name] is t and t.bundle == name for t in b.tasks), name
        assert all(t.viewers and set(t.viewers) <= set(registry.VIEWERS) for t in b.tasks), name
    assert set(TASKS) == {t.name for b in BUNDLES.values() for t in b.tasks}


def test_viewers_and_batch_models():
    assert registry.batch_models() == ("spleen_deepedit_seg", "wholeBody_ct", "swin_unetr_btcv", "pancreas_ct_dints")
    assert registry.viewer_tasks("slicer", ("deepgrow",)) == ("vista3d_slicer",)
    actions = registry.ohif_actions()
    assert actions["vista3d"] == "point" and actions["wholeBody_ct"] == "auto"
    assert "vista3d_slicer" not in actions  # Slicer's variant of VISTA3D


@pytest.mark.parametrize("change, message", [
    ({"kind": "unet"}, "kind 'unet' is not one of"),
    ({"name": "vista3d"}, "already registered"),
    ({"requests": (Request("x", "everything", warm=False),)}, "no request to warm it with"),
    ({"requests": (Request("x", "lasso"),)}, "kind 'lasso'"),
    ({"tasks": ()}, "no task serves it"),
])
def test_register_refuses_a_broken_entry_and_says_why(change, message):
    entry = BundleEntry(**{**_new_entry().__dict__, **change})
    with pytest.raises(ConfigError, match=message):
        registry.register(entry)
    assert NEW_BUNDLE not in BUNDLES and NEW_TASK not in TASKS and registry.MODELS == MODELS


def test_every_bundle_kind_has_its_task_class_and_every_sample_its_bundle():
    from rocm_zoo.samples.bundles import SAMPLE_BUNDLES
    from rocm_zoo.server.tasks import TASK_CLASSES

    assert set(TASK_CLASSES) == set(registry.BUNDLE_KINDS)
    assert set(SAMPLE_BUNDLES) == {n for n, b in BUNDLES.items() if b.sample} == set(BUNDLES)
    assert all(SAMPLE_BUNDLES[n].NAME == n for n in SAMPLE_BUNDLES)


def test_bench_times_the_registry_requests_marked_for_it():
    from rocm_zoo.bench.workloads import workloads_for

    names = {b: [w.name for w in workloads_for(b)] for b in BUNDLES}
    assert names["spleen_deepedit_annotation"] == ["one click in the spleen"]
    assert names["vista3d"] == ["label_prompt [3] (spleen)", "everything"]
    assert names["wholeBody_ct_segmentation"] == ["whole volume"]
    for b, entry in BUNDLES.items():
        assert names[b] == [r.name for r in entry.requests if r.bench]


def test_server_app_composition_imports_neither_samples_nor_bench():
    code = ("import sys, rocm_zoo.app.app, rocm_zoo.server.tasks.vista3d, rocm_zoo.server.tasks.segmentation, "
            "rocm_zoo.server.tasks.deepedit, rocm_zoo.server.batch.runs, rocm_zoo.app.config\n"
            "print([m for m in sys.modules if m.startswith(('rocm_zoo.samples', 'rocm_zoo.bench'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- the warm-up volume ------------------------------------------------------------------------------------------------
def test_warm_volumes_keep_the_grids_the_warm_up_always_used():
    from rocm_zoo.engine.warm_volume import DEFAULT_GRID, VISTA3D_GRID, ORGAN_HU, make_warm_volume
    from rocm_zoo.samples import phantom

    legacy = phantom.test_specs(1)[0]
    assert (DEFAULT_GRID.shape, DEFAULT_GRID.spacing, DEFAULT_GRID.orientation) == (
        legacy.shape, legacy.spacing, legacy.orientation)
    assert (VISTA3D_GRID.shape, VISTA3D_GRID.spacing, VISTA3D_GRID.orientation) == ((40, 32, 12), (4.0, 4.0, 5.0),
                                                                                      "LPS")
    for grid in (DEFAULT_GRID, VISTA3D_GRID):
        v = make_warm_volume(grid)
        assert v.image.shape == grid.shape and v.image.dtype.name == "int16"
        assert abs(float(v.image[tuple(v.click)]) - ORGAN_HU) < 80  # the click is in the organ (15 HU noise)
        assert v.clicks(2) == [v.click, [v.click[0] + 1, *v.click[1:]]]
        edge = make_warm_volume(grid)
        object.__setattr__(edge, "click", [grid.shape[0] - 1, *v.click[1:]])
        assert edge.clicks(2)[1][0] == grid.shape[0] - 1  # the voxels beside it stay inside the image
        assert [round(abs(v.affine[i, i]), 2) for i in range(3)] == list(grid.spacing)
    default = make_warm_volume(DEFAULT_GRID).image
    assert (default < -900).mean() > 0.2 and (default > -200).mean() > 0.3  # a body in air (VISTA3D's lies inside it)


# -- adding a bundle: one registry entry and one overlay file ----------------------------------------------------------
def _new_entry() -> BundleEntry:
    return BundleEntry(NEW_BUNDLE, "configs/inference.json", "models/model.pt", "sliding_window",
                       (registry.WHOLE_VOLUME,), (TaskEntry(NEW_TASK, NEW_TASK, NEW_BUNDLE, "segmentation", False),))


@pytest.fixture
def new_bundle(tmp_path, monkeypatch):
    """A made-up sliding-window bundle (the tiny wholeBody sample written under another folder name), its overlay
    file, and its registry entry; the table is put back afterwards."""
    from rocm_zoo.samples.bundles import wholebody_ct
    from rocm_zoo.samples.bundles.common import write_torch

    app = tmp_path / "app"
    bundle = app / "model" / NEW_BUNDLE
    wholebody_ct.write_files(bundle, "tiny")
    for rel, state in wholebody_ct.random_weights("tiny", 0).items():
        write_torch(bundle / rel, state)
    # The one overlay file, beside the shipped ones (a copy of the package's overlay folder stands in for it).
    shutil.copytree(OVERLAYS, app / "overlays")
    overlay = app / "overlays" / NEW_BUNDLE / "inference_rocm.json"
    overlay.parent.mkdir(parents=True)
    shutil.copy(OVERLAYS / wholebody_ct.NAME / "inference_rocm.json", overlay)
    monkeypatch.setattr("rocm_zoo.app.zoo.OVERLAYS_DIR", app / "overlays")
    monkeypatch.setattr("rocm_zoo.bench.network.OVERLAYS_DIR", app / "overlays")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # Zoo would set it for this process
    registry.register(_new_entry())
    try:
        yield app
    finally:
        registry.unregister(NEW_BUNDLE)
    assert registry.MODELS == MODELS and NEW_BUNDLE not in BUNDLES


def test_a_new_bundle_is_served_benchmarked_and_offered_by_the_cli(new_bundle):
    from rocm_zoo.app.zoo import Zoo
    from rocm_zoo.bench.network import variants
    from rocm_zoo.bench.workloads import workloads_for
    from rocm_zoo.cli import parser
    from rocm_zoo.engine.warm_volume import make_warm_volume
    from rocm_zoo.scale.ray_pool import worker_spec
    from rocm_zoo.server.tasks.segmentation import SegmentationTask

    zoo = Zoo(new_bundle, {"models": NEW_TASK, "device": "cpu"})
    task = zoo.tasks[NEW_TASK]
    assert type(task) is SegmentationTask and zoo.missing == {}
    assert task.warm_requests(make_warm_volume()) == [{}]
    assert task.warm_shapes()[0][1] == 1  # parsed from the new bundle's own config and metadata

    assert [w.name for w in workloads_for(NEW_BUNDLE)] == ["whole volume"]
    overlay = new_bundle / "overlays" / NEW_BUNDLE / "inference_rocm.json"
    assert [v.name for v in variants(overlay, None)] == ["fp32 eager (bundle as shipped)", "overlay"]
    assert NEW_TASK in parser().parse_args(["bench-ohif", "--model", NEW_TASK]).model
    batch = next(a for a in parser()._subparsers._group_actions[0].choices["batch"]._actions if a.dest == "model")
    assert NEW_TASK in batch.help
    spec = worker_spec(NEW_TASK, new_bundle / "model", new_bundle / "overlays", device="cpu")
    assert spec.bundle_dir == str((new_bundle / "model" / NEW_BUNDLE).resolve())


def test_a_missing_bundle_says_how_to_get_it_in_the_server_and_the_ray_pool(new_bundle, tmp_path):
    from rocm_zoo.app.zoo import Zoo
    from rocm_zoo.scale.ray_pool import worker_spec

    shutil.rmtree(new_bundle / "model" / NEW_BUNDLE)
    with pytest.raises(BundleNotFound, match="rocm-zoo sample --model-dir") as server:
        Zoo(new_bundle, {"models": NEW_TASK, "device": "cpu"})
    with pytest.raises(BundleNotFound, match="rocm-zoo sample --model-dir") as ray:
        worker_spec(NEW_TASK, new_bundle / "model", new_bundle / "overlays")
    assert f"Bundle '{NEW_BUNDLE}' not found at {new_bundle / 'model' / NEW_BUNDLE}" in str(ray.value)
    assert str(ray.value) in str(server.value)


# -- the warm-up requests, as each viewer sends them -------------------------------------------------------------------
@pytest.mark.slow
def test_each_task_warms_with_the_registry_requests_as_its_viewer_sends_them(tmp_path, monkeypatch):
    from rocm_zoo.app.zoo import Zoo
    from rocm_zoo.engine.warm_volume import make_warm_volume
    from rocm_zoo.samples.write import write_bundles

    app = tmp_path / "app"
    shutil.copytree(OVERLAYS, app / "overlays")
    write_bundles(app / "model", "tiny")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    zoo = Zoo(app, {"models": "all", "device": "cpu"})
    assert set(zoo.tasks) == set(TASKS)
    requests = {name: t.warm_requests(make_warm_volume(t.warm_grid)) for name, t in zoo.tasks.items()}
    c = make_warm_volume().click
    v = make_warm_volume(zoo.tasks["vista3d"].warm_grid).click
    assert requests["spleen_deepedit"] == requests["spleen_deepedit_seg"] == [{"spleen": [c], "background": []}]
    spleen = zoo.tasks["vista3d"].labels["spleen"]
    other = next(k for k in zoo.tasks["vista3d"].everything if k != spleen)
    v2 = [v[0] + 1, *v[1:]]
    assert requests["vista3d"] == [{"points": [v], "point_labels": [1], "label_prompt": [spleen]},
                                   {"points": [v, v2], "point_labels": [1, 1], "label_prompt": [spleen]},
                                   {"points": [v], "point_labels": [1]},
                                   {"label_prompt": [spleen]},
                                   {"label_prompt": [spleen, other]}]
    assert requests["vista3d_slicer"] == [{"label": "spleen", "foreground": [v], "background": []}]
    for name in registry.batch_models()[1:]:
        assert requests[name] == [{}]
    assert json.dumps(requests)  # what a client could send: plain JSON


def test_the_default_model_of_each_kind_is_the_first_registered_one():
    """What the benchmarks and the CLI use unless told another: Slicer's DeepEdit, OHIF's VISTA3D, and the first
    automatic segmentation (spleen_deepedit_seg, registered before it, is interactive)."""
    assert registry.default_task("deepedit") == "spleen_deepedit"
    assert registry.default_task("vista3d") == "vista3d"
    assert registry.default_task("segmentation") == "spleen_deepedit_seg"
    assert registry.default_task("segmentation", interactive=False) == "wholeBody_ct"
    with pytest.raises(ConfigError, match="no registered task of type 'deepgrow' \\(automatic\\)"):
        registry.default_task("deepgrow", interactive=False)
