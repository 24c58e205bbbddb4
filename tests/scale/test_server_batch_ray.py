"""`/batch/infer` on Ray workers (`--conf batch_engine ray`): the same API, progress and per-study failures as the
in-process batch, labels written by the server under their tag, the clinician's `final` tag refused. A real server on
loopback starts a local Ray cluster and one CPU worker at its first batch; the worker builds and warms the task as
the server does (compiled, from the suite's compile cache)."""

from __future__ import annotations

import shutil
import time

import pytest
import requests

from zoo_test_support import monailabel_server

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rocm-zoo[ray]')")

pytestmark = pytest.mark.slow

MODEL = "wholeBody_ct"
START_TIMEOUT_S = 900


def test_server_batch_on_a_ray_worker(sample_env, tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    good = [s.name for s in sample_env.specs[:2]]
    for image in good:
        shutil.copyfile(sample_env.image_path(image), studies / f"{image}.nii.gz")
    (studies / "corrupt_study.nii.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not a volume")
    log = tmp_path / "server.log"

    with monailabel_server(sample_env.app_dir, str(studies), MODEL, log, cwd=tmp_path, timeout_s=START_TIMEOUT_S,
                           env={"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor")},
                           conf={"batch_engine": "ray", "ray_workers": "1"}) as url:
        refused = requests.post(f"{url}/batch/infer/{MODEL}", json={"label_tag": "final"})
        assert refused.status_code == 422 and "final" in refused.json()["detail"]

        started = requests.post(f"{url}/batch/infer/{MODEL}", params={"images": "all"})
        assert started.status_code == 200, started.text
        assert started.json()["total"] == 3
        deadline = time.time() + START_TIMEOUT_S
        while (progress := requests.get(f"{url}/batch/infer").json())["state"] == "running":
            assert time.time() < deadline, f"batch still running: {progress}"
            time.sleep(1)

    assert progress["state"] == "done" and not progress["error"], progress
    assert (progress["done"], progress["failed"]) == (3, 1), progress
    assert progress["failures"][0]["image"] == "corrupt_study"
    assert "cannot be read" in progress["failures"][0]["reason"]
    labels = studies / "labels" / "original"
    assert sorted(p.name for p in labels.iterdir()) == sorted(f"{i}.nii.gz" for i in good)
    assert "ray worker" in log.read_text(), "the batch did not run on a Ray worker"
