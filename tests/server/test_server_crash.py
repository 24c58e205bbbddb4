"""Issue 15 on a real server on loopback, log-in off (the default there): `--conf allow_local_paths true` lets a
single-user workstation name a server file; and a `kill -9` in the middle of label saves and a batch leaves every
label whole or absent and the datastore consistent, and the next start finishes the batch.

The kill provably lands mid-write: the server runs with the atomic writer's test hook (`ROCM_ZOO_TEST_PAUSE_WRITE`,
engine/atomic_files.py), which holds a label save after its temporary file is written and before the rename; the test
waits for the hook's marker, then kills."""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import requests

import secure_server
from rocm_zoo.engine.atomic_files import TEST_PAUSE_WRITE
from rocm_zoo.server.store.datastore import PARTIAL

pytestmark = pytest.mark.slow

COPIES = 3  # of each sample study: a batch long enough to be killed in the middle


@pytest.fixture(scope="module")
def studies(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    folder = secure_server.copy_studies(sample_env, root / "studies")
    for f in sorted(folder.glob("*.nii.gz")):
        for i in range(1, COPIES):
            shutil.copy(f, folder / f"{f.name.split('.')[0]}_copy{i}.nii.gz")
    return folder


def _label_files(studies):
    return [p for p in (studies / "labels").rglob("*") if p.is_file()]


def _check_labels_whole(studies) -> int:
    """Every label file in place is complete (the whole volume reads) and on its image's grid; returns how many."""
    n = 0
    for path in _label_files(studies):
        if PARTIAL in path.name:
            continue
        image = studies / path.name
        label = nib.load(str(path))
        data = np.asarray(label.dataobj)  # a torn gzip fails here
        assert data.shape[:3] == nib.load(str(image)).shape[:3], path
        n += 1
    return n


def test_local_paths_allowed_with_the_conf_and_auth_off_on_loopback(sample_env, studies, tmp_path):
    outside = tmp_path / "outside" / "elsewhere.nii.gz"
    outside.parent.mkdir()
    shutil.copy(next(studies.glob("phantom_test0.nii.gz")), outside)
    with secure_server.running(sample_env, studies, studies.parent / "server-paths.log",
                               {"allow_local_paths": "true"}) as srv:
        assert requests.get(f"{srv.url}/auth/", timeout=10).json()["enabled"] is False
        assert requests.get(f"{srv.url}/info/", timeout=60).status_code == 200  # no token needed on loopback
        r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": str(outside), "output": "json"},
                          timeout=900)
        assert r.status_code == 200, r.text[:500]
        r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": "/no/such/file.nii.gz"}, timeout=60)
        assert r.status_code == 404 and "/no/such" not in r.text, r.text
    log = (studies.parent / "server-paths.log").read_text()
    assert "rocm_zoo auth: OFF" in log and "loopback" in log


def test_kill_9_during_saves_and_a_batch(sample_env, studies):
    images = sorted(p.name.split(".")[0] for p in studies.glob("*.nii.gz"))
    log = studies.parent / "server-crash.log"
    marker = studies.parent / "paused-write"
    arm = Path(f"{marker}.arm")
    srv = secure_server.start(sample_env, studies, log, {}, env={TEST_PAUSE_WRITE: str(marker)})
    stop_saving = threading.Event()
    saved = []

    def save_labels():  # a viewer saving labels over and over while the batch runs
        rng = random.Random(0)
        while not stop_saving.is_set():
            image = rng.choice(images)
            img = nib.load(str(studies / f"{image}.nii.gz"))
            label = np.zeros(img.shape[:3], np.uint8)
            label[::2, ::3, :] = rng.randint(1, 5)
            buf = nib.Nifti1Image(label, img.affine).to_bytes()
            import gzip

            try:
                r = requests.put(f"{srv.url}/datastore/label", params={"image": image, "tag": "manual"},
                                 files={"label": ("l.nii.gz", gzip.compress(buf))}, timeout=60)
                if r.status_code == 200:
                    saved.append(image)
            except requests.RequestException:
                return  # the server is gone

    try:
        r = requests.post(f"{srv.url}/batch/infer/wholeBody_ct", params={"images": "all"}, timeout=60)
        assert r.status_code == 200, r.text
        saver = threading.Thread(target=save_labels, daemon=True)
        saver.start()
        deadline = time.time() + 1200
        original = studies / "labels" / "original"
        while not (original.is_dir() and len(list(original.glob("*.nii.gz"))) >= 2):
            assert time.time() < deadline, "the batch wrote no label in 20 minutes"
            assert srv.proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        # The next manual label save stops between its complete temporary file and the rename: kill it there.
        # Written then renamed, as the server writes the marker: a half-written (empty) pattern would match any write.
        arming = Path(f"{arm}.writing")
        arming.write_text(str(studies / "labels" / "manual" / "*"))
        arming.replace(arm)
        look_until = time.time() + 120
        while not marker.exists():
            assert time.time() < look_until, "no label save reached the paused write in 2 minutes"
            assert srv.proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        paused = Path(marker.read_text())
        assert PARTIAL in paused.name and paused.stat().st_size > 0, paused
        final = paused.parent / paused.name.split(PARTIAL)[0].lstrip(".")
        before_kill = final.read_bytes() if final.exists() else None
        srv.proc.kill()  # SIGKILL: no handler runs
        srv.proc.wait()
        assert paused.exists(), "the kill did not land mid-write: the temporary file is gone"
    finally:
        stop_saving.set()
        arm.unlink(missing_ok=True)
        secure_server.stop(srv)
    progress_before = len(list(original.glob("*.nii.gz")))
    assert progress_before < len(images), "the batch finished before the kill: the test killed nothing"
    print(f"killed with {progress_before}/{len(images)} batch labels, {len(saved)} manual saves, "
          f"paused in the write of {paused.name}")
    # Before any restart: the index is whole JSON, every label in place is whole, and the label killed mid-write is
    # the one from before that save (or still absent).
    json.loads((studies / "datastore_v2.json").read_text())
    _check_labels_whole(studies)
    assert (final.read_bytes() if final.exists() else None) == before_kill

    # The next start: temporaries gone, index and files agree, and the batch finishes the rest.
    with secure_server.running(sample_env, studies, log, {}) as srv:
        listing = requests.get(f"{srv.url}/datastore/", params={"output": "all"}, timeout=60).json()["objects"]
        assert not [p for p in _label_files(studies) if PARTIAL in p.name]
        assert not paused.exists(), "the next start left the killed save's temporary file"
        on_disk = {(p.parent.name, p.name.split(".")[0]) for p in _label_files(studies)}
        indexed = {(tag, image) for image, obj in listing.items() for tag in obj.get("labels", {})}
        assert on_disk == indexed, (on_disk ^ indexed)
        # picks up where it was: the studies without a batch label (every study has a manual one by now)
        missing = [i for i in images if not (original / f"{i}.nii.gz").exists()]
        r = requests.post(f"{srv.url}/batch/infer/wholeBody_ct", params={"run_sync": "true"},
                          json={"image_ids": missing}, timeout=1800)
        assert r.status_code == 200 and r.json()["failed"] == 0 and r.json()["done"] == len(missing), r.text[:1000]
    assert sorted(p.name.split(".")[0] for p in original.glob("*.nii.gz")) == images
    assert _check_labels_whole(studies) >= len(images)
