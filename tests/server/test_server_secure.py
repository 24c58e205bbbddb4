"""Issue 15 on a real server with log-in on (`--conf auth on`, local users): every route refuses a missing, wrong
or expired token and a token of too small a role; requests name datastore ids, never server paths; uploads are
limited and checked before anything is stored; labels land whole."""

from __future__ import annotations

import json
import re

import nibabel as nib
import numpy as np
import pytest
import requests

import secure_server
from rocm_zoo.server.auth.users import UserFile
from rocm_zoo.server.store.datastore import PARTIAL

pytestmark = pytest.mark.slow

MAX_UPLOAD_MB = 4
VIEWER = "https://viewer.example:3000"  # the one browser origin allowed (--conf cors_origins)
IMAGE = "phantom_test0"
# Routes that need no token: the log-in itself, and MONAI Label's documentation pages.
# Open without a token: the log-in itself, and the health endpoints orchestrators probe.
OPEN = {("GET", "/auth/"), ("POST", "/auth/token"), ("GET", "/health/live"), ("GET", "/health/ready")}
ADMIN_ONLY = [("DELETE", "/datastore/image", {"id": IMAGE}), ("DELETE", "/datastore/label", {"id": IMAGE, "tag": "x"}),
              ("POST", "/batch/infer/wholeBody_ct", {}), ("DELETE", "/batch/infer", {}),
              ("POST", "/train/wholeBody_ct", {}), ("DELETE", "/train/", {}), ("GET", "/logs/", {}),
              ("GET", "/model/wholeBody_ct", {}), ("POST", "/reload", {})]


@pytest.fixture(scope="module")
def srv(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("secure")
    with secure_server.serving(sample_env, root, {"auth": "on", "max_upload_mb": str(MAX_UPLOAD_MB),
                                                  "cors_origins": VIEWER}) as server:
        yield server


def _operations(srv) -> list[tuple[str, str]]:
    schema = requests.get(f"{srv.url}/openapi.json", timeout=30).json()
    ops = [(m.upper(), p) for p, item in schema["paths"].items() for m in item if m in
           ("get", "put", "post", "delete", "head", "patch")]
    assert len(ops) > 30, ops
    return ops


def _filled(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _label(path, array, affine):
    nib.save(nib.Nifti1Image(array, affine), str(path))
    return path


def test_auth_says_it_is_on_and_logs_in(srv):
    assert requests.get(f"{srv.url}/auth/", timeout=10).json()["enabled"] is True
    r = requests.post(f"{srv.url}/auth/token", data={"username": "ann", "password": "wrong-password"}, timeout=30)
    assert r.status_code == 401
    r = requests.post(f"{srv.url}/auth/token", data={"username": "nobody", "password": "whatever-pw"}, timeout=30)
    assert r.status_code == 401
    me = requests.get(f"{srv.url}/auth/token/valid", headers=srv.headers("rev"), timeout=10).json()
    assert me["username"] == "rev" and "monailabel-reviewer" in me["roles"] and "monailabel-admin" not in me["roles"]
    assert requests.get(f"{srv.url}/info/", headers=srv.headers("ann"), timeout=30).status_code == 200
    schema = requests.get(f"{srv.url}/openapi.json", timeout=30).json()
    assert "OAuth2PasswordBearer" in schema["components"]["securitySchemes"]


def test_cors_only_for_the_configured_viewer(srv):
    def preflight(origin):
        return requests.options(f"{srv.url}/info/", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"})

    assert preflight(VIEWER).headers.get("access-control-allow-origin") == VIEWER
    evil = preflight("https://evil.example")
    assert "access-control-allow-origin" not in evil.headers, evil.headers
    r = requests.get(f"{srv.url}/auth/", headers={"Origin": "https://evil.example"}, timeout=10)
    assert "access-control-allow-origin" not in r.headers, r.headers


def test_every_route_refuses_no_wrong_or_expired_token(srv):
    expired = srv.expired_token("adm")
    forged = srv.token("adm")[:-4] + "AAAA"
    checked = 0
    for method, path in _operations(srv) + [("POST", "/reload")]:
        if (method, path) in OPEN:
            continue
        for label, headers in (("no token", {}), ("wrong token", {"Authorization": "Bearer not-a-token"}),
                               ("forged signature", {"Authorization": f"Bearer {forged}"}),
                               ("expired token", {"Authorization": f"Bearer {expired}"})):
            r = requests.request(method, srv.url + _filled(path), headers=headers, timeout=60)
            assert r.status_code == 401, f"{method} {path} with {label}: {r.status_code} {r.text[:200]}"
            checked += 1
    assert checked > 120
    # open without a token: the log-in, OHIF's static files, health
    assert requests.get(f"{srv.url}/ohif/", timeout=30).status_code == 200
    assert requests.get(f"{srv.url}/health/live", timeout=30).status_code == 200
    assert requests.get(f"{srv.url}/health/ready", timeout=30).status_code in (200, 503)


def test_roles(srv, tmp_path):
    ann, rev = srv.headers("ann"), srv.headers("rev")
    for method, path, params in ADMIN_ONLY:
        r = requests.request(method, srv.url + path, params=params, headers=rev, timeout=60)
        assert r.status_code == 403, f"{method} {path} as a reviewer: {r.status_code} {r.text[:200]}"
    img = nib.load(str(srv.studies / f"{IMAGE}.nii.gz"))
    label = _label(tmp_path / "l.nii.gz", np.zeros(img.shape, np.uint8), img.affine)
    put = lambda headers, tag: requests.put(f"{srv.url}/datastore/label", params={"image": IMAGE, "tag": tag},
                                            files={"label": ("l.nii.gz", label.read_bytes())}, headers=headers,
                                            timeout=60)
    assert put(ann, "final").status_code == 403  # final labels are the reviewers'
    assert put(ann, "").status_code == 403  # no tag is final
    assert put(ann, "draft").status_code == 200
    assert put(rev, "final").status_code == 200
    assert (srv.studies / "labels" / "final" / f"{IMAGE}.nii.gz").exists()
    # a removed user's token stops working at once
    users = UserFile(srv.users_file)
    users.add("temp", "annotator", "temporary-pw")
    token = requests.post(f"{srv.url}/auth/token", data={"username": "temp", "password": "temporary-pw"},
                          timeout=30).json()["access_token"]
    auth = {"Authorization": f"Bearer {token}"}
    assert requests.get(f"{srv.url}/info/", headers=auth, timeout=30).status_code == 200
    users.remove("temp")
    assert requests.get(f"{srv.url}/info/", headers=auth, timeout=30).status_code == 401


def test_server_paths_are_refused(srv, tmp_path):
    h = srv.headers("adm")
    inside = str(srv.studies / f"{IMAGE}.nii.gz")
    for image in (inside, "/etc/passwd", f"../studies/{IMAGE}.nii.gz"):
        r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": image}, headers=h, timeout=120)
        assert r.status_code == 404 and "not in the datastore" in r.json()["detail"], (image, r.text)
        assert str(srv.studies) not in r.text and "/etc" not in r.text, r.text
    r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": IMAGE}, headers=h, timeout=120,
                      files={"params": (None, json.dumps({"image": inside}))})  # the path smuggled in params
    assert r.status_code == 404 and str(srv.studies) not in r.text, r.text
    r = requests.post(f"{srv.url}/batch/infer/wholeBody_ct", json={"image_ids": [IMAGE, inside]}, headers=h,
                      timeout=60)
    assert r.status_code == 404 and str(srv.studies) not in r.text, r.text
    r = requests.get(f"{srv.url}/datastore/image", params={"image": "/etc/passwd"}, headers=h, timeout=30)
    assert r.status_code == 404


def test_uploads_are_limited_and_checked(srv, tmp_path):
    h = srv.headers("adm")
    before = sorted(p.name for p in srv.studies.glob("*.nii.gz"))
    big = np.random.default_rng(0).bytes((MAX_UPLOAD_MB + 1) << 20)
    r = requests.put(f"{srv.url}/datastore/image", params={"image": "big"}, files={"file": ("big.nii.gz", big)},
                     headers=h, timeout=120)
    assert r.status_code == 413 and "max_upload_mb" in r.text, r.text[:300]

    body = (b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="big.nii.gz"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n" + big + b"\r\n--xyz--\r\n")

    def chunks():  # no Content-Length (chunked): the limit holds while the body streams
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]

    r = requests.put(f"{srv.url}/datastore/image", params={"image": "big2"}, data=chunks(),
                     headers={**h, "Content-Type": "multipart/form-data; boundary=xyz"}, timeout=120)
    assert r.status_code == 413, r.text[:300]
    r = requests.put(f"{srv.url}/datastore/image", params={"image": "junk"},
                     files={"file": ("junk.nii.gz", b"\x1f\x8b not a volume")}, headers=h, timeout=60)
    assert r.status_code == 422, r.text
    assert sorted(p.name for p in srv.studies.glob("*.nii.gz")) == before

    img = nib.load(str(srv.studies / f"{IMAGE}.nii.gz"))
    cases = {
        "wrong size": _label(tmp_path / "a.nii.gz", np.zeros(np.array(img.shape) - 1, np.uint8), img.affine),
        "wrong spacing": _label(tmp_path / "b.nii.gz", np.zeros(img.shape, np.uint8), img.affine @ np.diag([2, 1, 1, 1])),
        "non-integer": _label(tmp_path / "c.nii.gz", np.full(img.shape, 0.5, np.float32), img.affine),
    }
    (tmp_path / "d.nii.gz").write_bytes(b"garbage")
    cases["unreadable"] = tmp_path / "d.nii.gz"
    for why, path in cases.items():
        r = requests.put(f"{srv.url}/datastore/label", params={"image": IMAGE, "tag": "checked"},
                         files={"label": (path.name, path.read_bytes())}, headers=h, timeout=60)
        assert r.status_code == 422, f"{why}: {r.status_code} {r.text[:200]}"
        assert str(tmp_path) not in r.text and "/tmp/" not in r.text, r.text
    assert not (srv.studies / "labels" / "checked").exists() or not list((srv.studies / "labels" / "checked").iterdir())
    good = np.zeros(img.shape, np.uint8)
    good[2:8, 2:8, 2:6] = 3
    path = _label(tmp_path / "good.nii.gz", good, img.affine)
    r = requests.put(f"{srv.url}/datastore/label", params={"image": IMAGE, "tag": "checked"},
                     files={"label": ("good.nii.gz", path.read_bytes())}, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    stored = srv.studies / "labels" / "checked" / f"{IMAGE}.nii.gz"
    assert np.array_equal(np.asarray(nib.load(str(stored)).dataobj), good)
    assert not list(stored.parent.glob(f".*{PARTIAL}*"))
    listed = requests.get(f"{srv.url}/datastore/", params={"output": "all"}, headers=h, timeout=30).json()
    assert "checked" in listed["objects"][IMAGE]["labels"]


def test_a_study_still_segments(srv, tmp_path):
    """The checks let the ordinary paths through: an id, and an uploaded file (`file`)."""
    h = srv.headers("ann")
    r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": IMAGE, "output": "json"}, headers=h,
                      timeout=900)
    assert r.status_code == 200, r.text[:500]
    data = (srv.studies / f"{IMAGE}.nii.gz").read_bytes()
    r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"output": "image"}, headers=h, timeout=900,
                      files={"file": ("upload.nii.gz", data)})
    assert r.status_code == 200, r.text[:500]
    name = re.search(r'filename="?([^";]+)', r.headers.get("content-disposition", "")).group(1)
    (tmp_path / name).write_bytes(r.content)
    import SimpleITK as sitk

    label = sitk.ReadImage(str(tmp_path / name))
    assert label.GetSize() == nib.load(str(srv.studies / f"{IMAGE}.nii.gz")).shape[:3]
