"""Issue 31 item 4 on a real server (log-in on, loopback): every route the server answers has a decided role, an
annotator is refused every route above its role, cannot replace a study's pixels, and cannot rewrite a `final`
label's info; a reviewer can."""

from __future__ import annotations

import hashlib
import json
import re

import nibabel as nib
import numpy as np
import pytest
import requests

import secure_server
from rocm_zoo.server.auth.roles import OPEN, ROLES, ROUTE_ROLES

pytestmark = pytest.mark.slow

IMAGE = "phantom_test0"
UNDECIDED = "routes without a role in ROUTE_ROLES"


@pytest.fixture(scope="module")
def srv(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("roles")
    with secure_server.serving(sample_env, root, {"auth": "on", "warmup": "false"}) as server:
        yield server


def _filled(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_route_has_a_decided_role(srv):
    schema = requests.get(f"{srv.url}/openapi.json", timeout=30).json()
    ops = {(m.upper(), p) for p, item in schema["paths"].items() for m in item
           if m in ("get", "put", "post", "delete", "head", "patch")}
    assert len(ops) > 30, ops
    adm = srv.headers("adm")
    for method, path in sorted(ops - set(ROUTE_ROLES)):  # only a route the server does not answer may lack a role
        r = requests.request(method, srv.url + _filled(path), headers=adm, timeout=60)
        assert r.status_code in (404, 405), f"{method} {path} is served without a role in ROUTE_ROLES: {r.status_code}"
    # routes outside the schema (OHIF, the proxy, /reload, deprecated ones): the server logs any it cannot decide
    log = srv.log.read_text()
    assert "rocm_zoo auth: ON" in log, log[-3000:]
    assert UNDECIDED not in log, [line for line in log.splitlines() if UNDECIDED in line]


def test_an_annotator_is_refused_every_route_above_its_role(srv):
    ann = srv.headers("ann")
    above = [(m, p) for (m, p), role in ROUTE_ROLES.items() if role != OPEN and ROLES.index(role) > 1]
    assert ("PUT", "/datastore/image") in above and len(above) >= 18  # model upload and delete are switched off
    for method, path in above:
        r = requests.request(method, srv.url + _filled(path), headers=ann, timeout=60)
        assert r.status_code in (403, 404, 405), f"{method} {path} as an annotator: {r.status_code} {r.text[:200]}"
        if r.status_code != 403:  # a route switched off (404) or no longer served for that method (405)
            assert "Role" not in r.text
    # and the same routes are open to an admin's role check (no 403), which says the table, not a typo, refused them
    adm = srv.headers("adm")
    for method, path in [("GET", "/logs/"), ("GET", "/datastore/dataset")]:
        r = requests.request(method, srv.url + path, headers=adm, timeout=120)
        assert r.status_code != 403, (method, path, r.text[:200])


def test_an_annotator_cannot_replace_or_add_a_study(srv, tmp_path):
    ann, adm = srv.headers("ann"), srv.headers("adm")
    stored = srv.studies / f"{IMAGE}.nii.gz"
    before = hashlib.sha256(stored.read_bytes()).hexdigest()
    other = next(p for p in srv.studies.glob("*.nii.gz") if p.name != stored.name).read_bytes()
    for url in (f"{srv.url}/datastore/image", f"{srv.url}/datastore/"):
        for image in (IMAGE, "brand_new_study"):
            r = requests.put(url, params={"image": image}, files={"file": ("x.nii.gz", other)}, headers=ann,
                             timeout=60)
            assert r.status_code == 403, (url, image, r.status_code, r.text[:200])
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == before
    assert not (srv.studies / "brand_new_study.nii.gz").exists()
    r = requests.put(f"{srv.url}/datastore/image/info", params={"image": IMAGE}, files={"info": (None, "{}")},
                     headers=ann, timeout=60)
    assert r.status_code == 403, r.text
    r = requests.put(f"{srv.url}/datastore/image", params={"image": "brand_new_study"},
                     files={"file": ("x.nii.gz", other)}, headers=adm, timeout=120)
    assert r.status_code == 200, r.text[:300]  # admins manage images


def test_only_reviewers_change_a_final_labels_info(srv, tmp_path):
    ann, rev = srv.headers("ann"), srv.headers("rev")
    img = nib.load(str(srv.studies / f"{IMAGE}.nii.gz"))
    path = tmp_path / "l.nii.gz"
    label = np.zeros(img.shape, np.uint8)
    label[2:6, 2:6, 2:4] = 1
    nib.save(nib.Nifti1Image(label, img.affine), str(path))
    for tag, who in (("final", rev), ("draft", ann)):
        r = requests.put(f"{srv.url}/datastore/label", params={"image": IMAGE, "tag": tag},
                         files={"label": ("l.nii.gz", path.read_bytes())}, headers=who, timeout=120)
        assert r.status_code == 200, r.text[:300]

    def info(tag):
        r = requests.get(f"{srv.url}/datastore/label/info", params={"label": IMAGE, "tag": tag}, headers=rev,
                         timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    final_before = info("final")
    changes = [("/datastore/label/info", "info"), ("/datastore/updatelabelinfo", "params")]
    for route, field in changes:
        for tag in ("final", ""):
            r = requests.put(srv.url + route, params={"label": IMAGE, "tag": tag},
                             files={field: (None, json.dumps({"train": False}))}, headers=ann, timeout=60)
            assert r.status_code == 403 and "reviewer" in r.json()["detail"], (route, tag, r.status_code, r.text)
    assert info("final") == final_before
    for route, field in changes:  # an annotator's own tags stay theirs
        r = requests.put(srv.url + route, params={"label": IMAGE, "tag": "draft"},
                         files={field: (None, json.dumps({"note": route}))}, headers=ann, timeout=60)
        assert r.status_code == 200, (route, r.text)
    r = requests.put(f"{srv.url}/datastore/label/info", params={"label": IMAGE, "tag": "final"},
                     files={"info": (None, json.dumps({"train": False}))}, headers=rev, timeout=60)
    assert r.status_code == 200, r.text
    assert info("final").get("train") is False
