"""Issue 15 on a real server with log-in on (`--conf auth on`, local users): every route refuses a missing, wrong
or expired token and a token of too small a role; requests name datastore ids, never server paths; uploads are
limited and checked before anything is stored; labels land whole."""

from __future__ import annotations

import json
import re
import subprocess
import sys

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


def test_the_audit_trail_names_who_did_what(srv, sample_env, tmp_path):
    """Issue 34's audit trail through the server: log-ins (and a failed one, with its address), a label saved, a
    deletion refused and one done, reading the trail (admins only), a user added by `rocm-zoo users` while the server
    writes to the same trail, and the configuration at start; the chain stays intact across both writers."""
    from rocm_zoo.server.audit.trail import now_utc

    since = now_utc()
    wrong = requests.post(f"{srv.url}/auth/token", data={"username": "rev", "password": "not-it"}, timeout=30)
    assert wrong.status_code == 401
    ann, adm = srv.headers("ann"), srv.headers("adm")
    img = nib.load(str(srv.studies / f"{IMAGE}.nii.gz"))
    label = _label(tmp_path / "l.nii.gz", np.zeros(img.shape, np.uint8), img.affine)
    saved = requests.put(f"{srv.url}/datastore/label", params={"image": IMAGE, "tag": "audited"},
                         files={"label": ("l.nii.gz", label.read_bytes())}, headers=ann, timeout=60)
    assert saved.status_code == 200, saved.text
    gone = {"id": IMAGE, "tag": "audited"}
    assert requests.delete(f"{srv.url}/datastore/label", params=gone, headers=ann, timeout=60).status_code == 403
    assert requests.delete(f"{srv.url}/datastore/label", params=gone, headers=adm, timeout=60).status_code == 200
    assert requests.get(f"{srv.url}/audit/", headers=ann, timeout=60).status_code == 403
    added = subprocess.run([sys.executable, "-m", "rocm_zoo.cli", "users", "add", "aud", "--role", "annotator",
                            "--password-stdin", "--users-file", str(srv.users_file), "--app", str(sample_env.app_dir)],
                           input="audit-user-pw\n", capture_output=True, text=True, timeout=120)
    assert added.returncode == 0, added.stderr

    def read(**params):
        r = requests.get(f"{srv.url}/audit/", params=params, headers=adm, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    trail = read(since=since)
    assert trail["verify"]["intact"], trail["verify"]
    seen = [(e["event"], e["actor"]["user"], e["actor"]["role"], e["details"].get("status")) for e in trail["entries"]]
    assert ("login.failed", "rev", None, None) in seen
    assert ("login", "ann", "annotator", None) in seen and ("login", "adm", "admin", None) in seen
    assert ("label.saved", "ann", "annotator", 200) in seen
    assert ("label.deleted", "ann", "annotator", 403) in seen and ("label.deleted", "adm", "admin", 200) in seen
    assert ("audit.read", "ann", "annotator", 403) in seen
    assert any(event == "user.added" and user.startswith("os:") for event, user, _, _ in seen), seen
    by_event = {e["event"]: e for e in trail["entries"]}
    assert by_event["login.failed"]["actor"]["address"] == "127.0.0.1"
    assert by_event["label.saved"]["details"]["image"] == IMAGE and by_event["label.saved"]["details"]["tag"] == "audited"
    assert by_event["user.added"]["details"] == {"name": "aud", "role": "annotator"}
    assert "python-requests" in by_event["label.saved"]["actor"]["client"]
    # the reading above is itself in the trail (recorded after its answer), and the filters hold
    assert any(e["event"] == "audit.read" and e["actor"]["user"] == "adm" for e in read(since=since)["entries"])
    assert {e["actor"]["user"] for e in read(since=since, user="ann")["entries"]} == {"ann"}
    assert all(e["details"].get("image") == IMAGE or e["details"].get("id") == IMAGE
               for e in read(since=since, image=IMAGE)["entries"])
    started = [e["details"] for e in read(event="server.started")["entries"]]  # every test server shares the app
    assert any(d["auth"] == "local" and d["conf"]["models"] == ["wholeBody_ct"] and d["conf"]["max_upload_mb"] ==
               MAX_UPLOAD_MB for d in started), started
    verified = subprocess.run([sys.executable, "-m", "rocm_zoo.cli", "audit", "verify", "--app",
                               str(sample_env.app_dir)], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stdout + verified.stderr


def test_a_saved_label_says_who_made_it_from_which_model(srv, tmp_path):
    """Issue 34's provenance: the annotator's inferences on the image (how many, since when, which model and weights
    version) and the save itself (user, role, client, time) land in the label's info, kept in the datastore's file; a
    client cannot forge it, neither when saving nor through the info routes."""
    ann, rev = srv.headers("ann"), srv.headers("rev")
    image = "phantom_test1"  # no other test of the module runs a model on it
    for _ in range(2):
        r = requests.post(f"{srv.url}/infer/wholeBody_ct", params={"image": image, "output": "json"}, headers=ann,
                          timeout=900)
        assert r.status_code == 200, r.text[:300]
    img = nib.load(str(srv.studies / f"{image}.nii.gz"))
    label = _label(tmp_path / "l.nii.gz", np.zeros(img.shape, np.uint8), img.affine)
    forged = {"label_info": [{"name": "spleen", "idx": 1}], "provenance": {"user": "someone-else", "inferences": 99}}

    def save(headers, tag):
        r = requests.put(f"{srv.url}/datastore/label", params={"image": image, "tag": tag}, data={"params":
                         json.dumps(forged)}, files={"label": ("l.nii.gz", label.read_bytes())}, headers=headers,
                         timeout=60)
        assert r.status_code == 200, r.text
        info = requests.get(f"{srv.url}/datastore/label/info", params={"label": image, "tag": tag}, headers=rev,
                            timeout=60)
        assert info.status_code == 200, info.text
        return info.json()

    info = save(ann, "prov")
    made = info["provenance"]
    assert made["user"] == "ann" and made["role"] == "annotator" and made["tag"] == "prov"
    assert made["inferences"] == 2 and made["model"] == "wholeBody_ct" and made["weights"] == "shipped"
    assert made["client"] == "3D Slicer or MONAI Label's client (Python)" and "python-requests" in made["client_agent"]
    assert 0 <= made["seconds_since_first_inference"] < 1800 and made["first_inference"] <= made["saved"]
    assert info["label_info"] == forged["label_info"]  # the rest of what the client sent is kept
    # the reviewer ran nothing on this image: a save of theirs starts from no model's mask
    by_reviewer = save(rev, "prov-rev")["provenance"]
    assert by_reviewer["user"] == "rev" and by_reviewer["inferences"] == 0 and by_reviewer["model"] is None
    # the info routes cannot rewrite it
    r = requests.put(f"{srv.url}/datastore/label/info", params={"label": image, "tag": "prov"},
                     data={"info": json.dumps({"provenance": {"user": "someone-else"}, "note": "checked"})},
                     headers=ann, timeout=60)
    assert r.status_code == 200, r.text
    after = requests.get(f"{srv.url}/datastore/label/info", params={"label": image, "tag": "prov"}, headers=ann,
                         timeout=60).json()
    assert after["provenance"] == made and after["note"] == "checked"
    kept = json.loads((srv.studies / "datastore_v2.json").read_text())
    assert kept["objects"][image]["labels"]["prov"]["info"]["provenance"] == made  # kept across restarts
