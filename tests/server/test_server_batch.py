"""`/batch/infer` runs in the server process with the warm models: progress while it runs, one bad study reported
while the rest complete, labels written atomically under their tag, a clinician's `final` label never touched."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
import requests
from filelock import FileLock

pytestmark = pytest.mark.slow

MODEL = "wholeBody_ct"
GOOD = ["phantom_test0", "phantom_test2"]


def wait_done(server: str, timeout_s: float = 900) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        progress = requests.get(f"{server}/batch/infer").json()
        if progress.get("state") != "running":
            return progress
        time.sleep(1)
    pytest.fail(f"batch still running after {timeout_s} s: {progress}")


def wait_listed(server: str, image_id: str, present: bool = True, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        listed = image_id in requests.get(f"{server}/datastore/?output=all").json()["objects"]
        if listed == present:
            return
        time.sleep(0.5)
    pytest.fail(f"{image_id} {'not ' if present else ''}listed by the datastore after {timeout_s} s")


@contextmanager
def datastore_locked(sample_env):
    """Holds the local datastore's own file lock (the one MONAI Label and the server's label writer take, across
    processes): a batch that reaches its first label waits there, so it is still running, deterministically, until
    the test lets go. No request of these tests needs the lock; only the batch's label writes do."""
    with FileLock(str(sample_env.paths.studies / ".lock")):
        yield


def wait_progress(server: str, until, what: str, timeout_s: float = 900) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        progress = requests.get(f"{server}/batch/infer").json()
        if until(progress):
            return progress
        time.sleep(0.5)
    pytest.fail(f"batch not {what} after {timeout_s} s: {progress}")


def test_batch_reports_a_corrupt_study_completes_the_rest_and_keeps_final_labels(server, sample_env):
    # A clinician's final label, saved through MONAI Label's own API, that the batch must leave byte for byte.
    final = sample_env.paths.truth / "phantom_test0.nii.gz"
    with open(final, "rb") as f:
        r = requests.put(f"{server}/datastore/label", params={"image": "phantom_test0", "tag": "final"},
                         files={"label": ("phantom_test0.nii.gz", f)})
    assert r.status_code == 200, r.text
    final_path = sample_env.paths.studies / "labels" / "final" / "phantom_test0.nii.gz"
    final_bytes = final_path.read_bytes()

    # A study that cannot be read, put straight into the datastore folder (uploads are checked, a copied file is not)
    corrupt = sample_env.paths.studies / "corrupt_study.nii.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00 this is not a volume")
    wait_listed(server, "corrupt_study")
    try:
        refused = requests.post(f"{server}/batch/infer/{MODEL}", json={"label_tag": "final", "image_ids": GOOD})
        assert refused.status_code == 422 and "final" in refused.json()["detail"]

        with datastore_locked(sample_env):  # the batch cannot finish its first study's label while this is held
            started = requests.post(f"{server}/batch/infer/{MODEL}",
                                    json={"image_ids": [GOOD[0], "corrupt_study", GOOD[1]]})
            assert started.status_code == 200, started.text
            assert started.json()["total"] == 3
            busy = requests.post(f"{server}/batch/infer/{MODEL}", json={"image_ids": GOOD})
            assert busy.status_code == 409, busy.text  # one batch at a time
            assert started.json()["id"] in busy.json()["detail"] and "DELETE /batch/infer" in busy.json()["detail"]
            assert requests.get(f"{server}/batch/infer").json()["state"] == "running"
        progress = wait_done(server)
    finally:
        corrupt.unlink()
        wait_listed(server, "corrupt_study", present=False)

    assert progress["state"] == "done"
    assert (progress["done"], progress["failed"]) == (3, 1), progress
    assert progress["failures"][0]["image"] == "corrupt_study"
    assert "cannot be read" in progress["failures"][0]["reason"]
    assert progress["studies_per_min"] > 0 and progress["eta_s"] is None
    for image_id in GOOD:
        assert list((sample_env.paths.studies / "labels" / "original").glob(f"{image_id}.*")), image_id
    assert final_path.read_bytes() == final_bytes, "the clinician's final label changed"
    assert not list((sample_env.paths.studies / "labels" / "original").glob(".*")), "a temp label file was left"


def test_batch_of_an_unknown_model_or_selection_is_a_clear_error(server):
    r = requests.post(f"{server}/batch/infer/no_such_model")
    assert r.status_code == 404 and "no_such_model" in r.json()["detail"]
    r = requests.post(f"{server}/batch/infer/{MODEL}", params={"images": "some"})
    assert r.status_code == 422 and "labeled" in r.json()["detail"]


def test_delete_stops_a_running_batch_after_its_current_study(server, sample_env):
    studies = GOOD * 3  # six studies; the lock holds the batch inside the first
    with datastore_locked(sample_env):
        started = requests.post(f"{server}/batch/infer/{MODEL}", json={"image_ids": studies, "label_tag": "stopped"})
        assert started.status_code == 200, started.text
        stopping = requests.delete(f"{server}/batch/infer")
        assert stopping.status_code == 200, stopping.text
        assert stopping.json()["id"] == started.json()["id"] and stopping.json()["state"] == "running"
    progress = wait_progress(server, lambda p: p.get("state") != "running", "stopped")
    assert progress["id"] == started.json()["id"]
    assert progress["state"] == "stopped", progress
    # The study it was on completes (its label written whole); none after it starts. (0 would mean the stop arrived
    # before the batch's thread took its first study, which the thread does as it starts, before the POST answers.)
    assert (progress["done"], progress["failed"], progress["total"]) == (1, 0, len(studies)), progress
    assert progress["eta_s"] is None
    assert list((sample_env.paths.studies / "labels" / "stopped").glob(f"{studies[0]}.*")), "the current study's label"
    # Stopped, the runner is free and the server still serves: a new batch runs to the end.
    again = requests.post(f"{server}/batch/infer/{MODEL}", json={"image_ids": GOOD[:1], "label_tag": "stopped"})
    assert again.status_code == 200, again.text
    done = wait_done(server)
    assert done["id"] == again.json()["id"] and (done["state"], done["done"], done["failed"]) == ("done", 1, 0)
    assert requests.delete(f"{server}/batch/infer").json()["state"] == "done"  # nothing running: nothing to stop
