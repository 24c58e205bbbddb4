"""Issue 31, item 7, against the real server: no route runs a model outside the request queues. MONAI Label's WSI
inference (`/infer/wsi*`) is gone: it answers the same 404 whatever the image names, an existing server file or not
(it was a file-existence oracle), and 14 concurrent calls run nothing. Scoring (which started the app again in a
subprocess per call) takes no POST; the schema lists neither. Nor can a client overwrite or delete the served weights
(MONAI Label's `PUT` and `DELETE /model/{model}`): weights change through trainings and rollbacks only."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

import secure_server

pytestmark = pytest.mark.slow

CONCURRENT = 14


@pytest.fixture(scope="module")
def srv(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("outside_queue")
    with secure_server.serving(sample_env, root, {}, users=False) as server:
        yield server


def _wsi(srv, image: str, route: str = "wsi_v2") -> requests.Response:
    return requests.post(f"{srv.url}/infer/{route}/{secure_server.MODEL}", params={"image": image},
                         data={"wsi": "{}"}, timeout=60)


def test_wsi_inference_is_gone_and_tells_nothing_about_server_files(srv):
    answers = {image: _wsi(srv, image) for image in ("/etc/passwd", "/etc/no_such_file", "phantom_test0")}
    assert {r.status_code for r in answers.values()} == {404}, {k: r.text for k, r in answers.items()}
    assert len({r.text for r in answers.values()}) == 1  # the same answer, whatever the image
    assert _wsi(srv, "/etc/passwd", route="wsi").status_code == 404


def test_concurrent_wsi_calls_run_nothing(srv):
    before = requests.get(f"{srv.url}/info/", timeout=30).json()["rocm_zoo"]["requests"]
    log_size = srv.log.stat().st_size
    with ThreadPoolExecutor(CONCURRENT) as pool:
        codes = list(pool.map(lambda i: _wsi(srv, "phantom_test0").status_code, range(CONCURRENT)))
    assert codes == [404] * CONCURRENT
    after = requests.get(f"{srv.url}/info/", timeout=30).json()["rocm_zoo"]["requests"]
    assert after["queues"] == before["queues"]  # nothing admitted, nothing served
    assert "infer_wsi" not in srv.log.read_text()[log_size:]


def test_scoring_runs_nothing_and_the_schema_lists_neither(srv):
    assert requests.post(f"{srv.url}/scoring/dice", timeout=30).status_code == 404
    assert requests.post(f"{srv.url}/scoring/", timeout=30).status_code == 405
    assert requests.get(f"{srv.url}/scoring/", timeout=30).status_code in (200, 404)  # status of nothing: no work
    paths = requests.get(f"{srv.url}/openapi.json", timeout=30).json()["paths"]
    assert not [p for p in paths if p.startswith("/infer/wsi")]
    assert "post" not in paths.get("/scoring/{method}", {})


def test_active_learning_still_answers_through_its_bound(srv):
    for strategy in ("random", "first"):
        r = requests.post(f"{srv.url}/activelearning/{strategy}", json={}, timeout=60)
        assert r.status_code == 200 and r.json().get("id"), r.text
    assert requests.post(f"{srv.url}/activelearning/no_such", json={}, timeout=60).status_code == 404


def test_served_weights_cannot_be_overwritten_or_deleted_over_http(srv, sample_env):
    weights = sample_env.app_dir / "model" / "wholeBody_ct_segmentation" / "models" / "model.pt"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    r = requests.put(f"{srv.url}/model/{secure_server.MODEL}", files={"file": ("model.pt", b"not weights")}, timeout=30)
    assert r.status_code == 405, r.text
    assert requests.delete(f"{srv.url}/model/{secure_server.MODEL}", timeout=30).status_code == 405
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest
    paths = requests.get(f"{srv.url}/openapi.json", timeout=30).json()["paths"]
    assert set(paths["/model/{model}"]) == {"get"}
    r = requests.post(f"{srv.url}/infer/{secure_server.MODEL}", params={"image": "phantom_test0", "output": "json"},
                      timeout=600)
    assert r.status_code == 200, r.text[:300]  # the model still serves
