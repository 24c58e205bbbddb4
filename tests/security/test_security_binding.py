"""Issue 31 item 8 on real servers: log-in follows every `--host` (`--host 127.0.0.1 --host 0.0.0.0` listens on
0.0.0.0, so log-in is on), and on loopback a request whose Host header names another machine (DNS rebinding) is
refused before it reaches the datastore. Every request goes to 127.0.0.1."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import requests

import secure_server

pytestmark = pytest.mark.slow

IMAGE = "phantom_test0"
PROXY_NAME = "gw.hospital.example"  # --conf allowed_hosts


@pytest.fixture(scope="module")
def double_host(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("double_host")
    # argparse keeps the last --host: uvicorn listens on 0.0.0.0 (the test connects to 127.0.0.1 only)
    with secure_server.serving(sample_env, root, {"warmup": "false"}, images=(IMAGE,),
                               hosts=("127.0.0.1", "0.0.0.0")) as server:
        yield server


@pytest.fixture(scope="module")
def loopback(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("loopback")
    with secure_server.serving(sample_env, root, {"warmup": "false", "allowed_hosts": PROXY_NAME}, images=(IMAGE,),
                               users=False) as server:
        yield server


def test_log_in_follows_every_host(double_host):
    assert requests.get(f"{double_host.url}/auth/", timeout=30).json()["enabled"] is True
    for path in ("/info/", "/datastore/"):
        r = requests.get(double_host.url + path, timeout=30)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
    assert requests.get(f"{double_host.url}/info/", headers=double_host.headers("ann"), timeout=30).status_code == 200
    log = double_host.log.read_text()
    assert "rocm_zoo auth: ON (listening beyond loopback (127.0.0.1, 0.0.0.0))" in log, log[-3000:]
    assert "auth: OFF" not in log


def test_a_rebound_name_is_refused_on_loopback(loopback, tmp_path):
    port = loopback.url.rsplit(":", 1)[1]
    assert requests.get(f"{loopback.url}/auth/", timeout=30).json()["enabled"] is False  # log-in off: loopback
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"0.0.0.0:{port}"):
        for path in ("/datastore/", "/info/", "/health/live", "/ohif/"):
            r = requests.get(loopback.url + path, headers={"Host": host}, timeout=30)
            assert r.status_code == 421, (host, path, r.status_code, r.text[:200])
            assert IMAGE not in r.text and "allowed_hosts" in r.json()["detail"], r.text
    img = nib.load(str(loopback.studies / f"{IMAGE}.nii.gz"))
    path = tmp_path / "l.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(img.shape, np.uint8), img.affine), str(path))
    r = requests.put(f"{loopback.url}/datastore/label", params={"image": IMAGE, "tag": "rebound"},
                     files={"label": ("l.nii.gz", path.read_bytes())}, headers={"Host": f"evil.example:{port}"},
                     timeout=60)
    assert r.status_code == 421, r.text
    assert not (loopback.studies / "labels" / "rebound").exists()
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}", f"{PROXY_NAME}:{port}"):
        r = requests.get(f"{loopback.url}/datastore/", params={"output": "all"}, headers={"Host": host}, timeout=30)
        assert r.status_code == 200 and IMAGE in r.text, (host, r.status_code, r.text[:200])
    assert "-> 421" in loopback.log.read_text()
