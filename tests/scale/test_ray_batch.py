"""Batch segmentation on Ray workers: a real local Ray cluster on loopback, three CPU workers with the tiny
wholeBody_ct sample bundle (eager: an extra overlay turns compile off, so the workers start in seconds instead of
compiling ~40 s each; the compiled path is the server's, tested in test_server_segmentation), two of them killed
mid-run, one by the OS (SIGKILL of its process: Ray restarts it) and one with ray.kill (dropped)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from zoo_test_support import REPO, free_port
from rocm_zoo.engine.overlay import OVERLAYS_DIR

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rocm-zoo[ray]')")

pytestmark = pytest.mark.slow

MODEL = "wholeBody_ct"
BUNDLE = "wholeBody_ct_segmentation"
GOOD = [f"study{i}" for i in range(9)]
CORRUPT = "corrupt_study"
FINAL = "study0"  # has an annotator's final label before the batch


@pytest.fixture(scope="module")
def eager_overlay(tmp_path_factory):
    path = tmp_path_factory.mktemp("overlay") / "eager.json"
    path.write_text(json.dumps({"rocm_overlay#compile": False}))
    return path


@pytest.fixture(scope="module")
def ray_local():
    from rocm_zoo.scale.ray_pool import connect

    connect(None, num_cpus=3)  # three 1-CPU workers on the suite's 2 cores: slower, but three processes to kill
    yield
    ray.shutdown()


def _studies(sample_env, folder):
    """Nine copies of the three small test phantoms under new names, and a file that is not a volume."""
    folder.mkdir()
    sources = [sample_env.image_path(s.name) for s in sample_env.specs[:3]]
    for i, image in enumerate(GOOD):
        shutil.copyfile(sources[i % 3], folder / f"{image}.nii.gz")
    (folder / f"{CORRUPT}.nii.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not a volume")
    return folder


def _label(path):
    img = nib.load(str(path))
    return np.asarray(img.dataobj), img.affine


def test_workers_killed_mid_run_lose_no_study_and_labels_match_the_single_process_path(
        sample_env, tmp_path, eager_overlay, ray_local):
    from rocm_zoo.scale.ray_batch import RayEngine
    from rocm_zoo.scale.ray_pool import WorkerPlan, WorkerPool, worker_spec
    from rocm_zoo.server.batch.runs import BatchRun
    from rocm_zoo.server.store.datastore import open_local

    studies = _studies(sample_env, tmp_path / "studies")
    store = open_local(studies)
    store.save_label(FINAL, str(sample_env.paths.truth / f"{sample_env.specs[0].name}.nii.gz"), "final", {})
    final_path = studies / "labels" / "final" / f"{FINAL}.nii.gz"
    final_bytes = final_path.read_bytes()

    spec = worker_spec(MODEL, sample_env.paths.model_dir, OVERLAYS_DIR, (eager_overlay,), "cpu")
    pool = WorkerPool(spec, WorkerPlan(workers=3, gpus_per_worker=0, cpus_per_worker=1), restarts=1)
    pool.start()
    killed = {}

    def kill_two_workers_at_first_result(run, outcome):
        # Every worker holds studies now (nine studies, two queued per worker): both kills lose at least one.
        if killed:
            return
        killed["os"], killed["ray"] = pool.info[0]["name"], pool.info[1]["name"]
        os.kill(pool.info[0]["pid"], signal.SIGKILL)  # a crash: Ray restarts the process, it warms again
        ray.kill(pool.actors[1])  # gone for good: dropped

    run = BatchRun(model=MODEL, tag="original", images=[*GOOD[:4], CORRUPT, *GOOD[4:]])
    try:
        RayEngine(lambda _: pool, lambda: store, max_retries=2, on_outcome=kill_two_workers_at_first_result)(run, {})
    finally:
        pool.shutdown()
    report = run.report()

    by_image = {s["image"]: s for s in report["studies"]}
    assert len(report["studies"]) == len(by_image) == 10, report["studies"]
    assert [i for i in GOOD if not by_image[i]["ok"]] == [], report["studies"]
    assert not by_image[CORRUPT]["ok"] and "cannot be read" in by_image[CORRUPT]["reason"]
    assert by_image[CORRUPT]["attempts"] == 1, "an ordinary failure must not be retried"
    retried = [i for i in GOOD if by_image[i]["attempts"] > 1]
    assert len(retried) >= 2, f"both killed workers held a study; retried: {retried}"
    events = {(e["worker"], e["event"]) for e in pool.events}
    assert {(killed["os"], "died"), (killed["os"], "restarted"), (killed["ray"], "died"),
            (killed["ray"], "dropped")} <= events, pool.events

    labels = studies / "labels" / "original"
    assert sorted(p.name for p in labels.iterdir()) == sorted(f"{i}.nii.gz" for i in GOOD)
    assert final_path.read_bytes() == final_bytes, "the annotator's final label changed"
    assert not list(studies.rglob(".*.nii.gz*")), "a temporary label file was left"

    # The same studies through the task the server builds, in this process: the same label, voxel for voxel. With the
    # workers' one thread: the sample's 105 logits are close where it learnt nothing (99 of its classes), and a
    # different CPU reduction order (2 threads) moves ~1% of argmax voxels.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _compare_with_single_process_path(studies, labels, spec)
    finally:
        torch.set_num_threads(threads)


def _compare_with_single_process_path(studies, labels, spec):
    from rocm_zoo.engine.image_cache import ImageCache
    from rocm_zoo.engine.pool import NetworkPool
    from rocm_zoo.registry import TASKS
    from rocm_zoo.server.tasks import make_task

    entry = TASKS[MODEL]
    task = make_task(entry, Path(spec.bundle_dir), tuple(Path(o) for o in spec.overlays),
                     NetworkPool(), ImageCache(0), "cpu")
    for image in GOOD[:3]:
        label_file, _ = task({"image": str(studies / f"{image}.nii.gz")})
        here, here_affine = _label(label_file)
        os.remove(label_file)
        there, there_affine = _label(labels / f"{image}.nii.gz")
        assert here.shape == there.shape and np.allclose(here_affine, there_affine)
        assert (here == there).all(), f"{image}: {(here != there).mean():.2%} voxels differ"
        assert len(np.unique(there)) > 1, "an all-background label would make this comparison empty"


def test_cli_refuses_final_unknown_model_no_studies_and_an_unreachable_address(sample_env, tmp_path):
    def batch(*args):
        env = dict(os.environ, PYTHONPATH=str(REPO / "lib"))
        return subprocess.run([sys.executable, "-m", "rocm_zoo.cli", "batch", "--model-dir",
                               str(sample_env.paths.model_dir), *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)

    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copyfile(sample_env.image_path(sample_env.specs[0].name), studies / "one.nii.gz")
    final = batch("--model", MODEL, "--studies", str(studies), "--tag", "final")
    assert final.returncode == 2 and "final" in final.stderr, final.stderr
    unknown = batch("--model", "wholebody", "--studies", str(studies))
    assert unknown.returncode == 2 and "Did you mean 'wholeBody_ct'" in unknown.stderr, unknown.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = batch("--model", MODEL, "--studies", str(empty))
    assert none.returncode == 2 and "no studies" in none.stderr, none.stderr
    address = f"127.0.0.1:{free_port()}"
    unreachable = batch("--model", MODEL, "--studies", str(studies), "--address", address)
    assert unreachable.returncode == 2 and f"cannot reach a Ray cluster at {address}" in unreachable.stderr, \
        unreachable.stderr[-2000:]
    assert not (studies / "labels" / "original").exists() or not list((studies / "labels" / "original").iterdir())
