"""Issue 31, item 6 on a real server (log-in on, the three roles): no answer, success included, names a server path.

Every GET route of /openapi.json and the routes the schema leaves out is called with real ids (an image, a label, a
session, a model, a strategy), as an admin, plus the answers a client gets from the POST and PUT routes it uses
(inference with output json, by id and uploaded; active learning; a label save; image and label info; a session);
every JSON string, every text body and every header is checked for the studies folder, the app folder, the
temporary folder, the sessions folder and any absolute path of this machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import requests

import secure_server

pytestmark = pytest.mark.slow

IMAGE = "phantom_test0"
MODEL = secure_server.MODEL
# A path of this machine: one of its top-level folders, then at least one more part, not inside a URL or a word.
TOP = sorted(d for d in os.listdir("/") if d and not d.startswith("."))
ABSOLUTE = re.compile(r"(?<![\w.:/-])/(?:" + "|".join(map(re.escape, TOP)) + r")/[^\s\"'<>]+")
HIDDEN_GETS = ["/", "/favicon.ico", "/logs/?text=true", "/logs/?lines=0", "/ohif/"]  # routes not in the schema


@pytest.fixture(scope="module")
def srv(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    tmp = root / "tmp"
    tmp.mkdir()
    sessions = root / "sessions"
    env = {"TMPDIR": str(tmp), "MONAI_LABEL_SESSION_PATH": str(sessions)}
    conf = {"auth": "on", "uncertainty_flips": "1", "uncertainty_max_new": "2"}  # uncertainty: fewer CPU runs
    with secure_server.serving(sample_env, root, conf, env=env) as server:
        server.secrets = tuple(str(p) for p in (server.studies, sample_env.app_dir, tmp, sessions, root,
                                                sample_env.root))
        yield server


class Walk:
    """Collects every server path seen in answers."""

    def __init__(self, srv):
        self.srv = srv
        self.found: list[str] = []
        self.checked: list[str] = []

    def _text(self, where: str, text: str) -> None:
        for secret in self.srv.secrets:
            if secret in text:
                self.found.append(f"{where}: {secret!r}")
        for m in ABSOLUTE.finditer(text):
            self.found.append(f"{where}: {m.group(0)!r}")

    def _json(self, where: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                self._text(f"{where} key", str(k))
                self._json(f"{where}.{k}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self._json(f"{where}[{i}]", v)
        elif isinstance(value, str):
            self._text(where, value)

    def answer(self, label: str, r: requests.Response) -> requests.Response:
        where = f"{label} -> {r.status_code}"
        self.checked.append(where)
        for k, v in r.headers.items():
            self._text(f"{where} header {k}", v)
        kind = r.headers.get("content-type", "")
        if "json" in kind:
            self._json(where, r.json())
        elif kind.startswith("text/") or "multipart" in kind:
            self._text(where, r.content.decode("latin-1"))  # multipart: the JSON part; the label is binary
        return r

    def call(self, method: str, path: str, who: str = "adm", **kw) -> requests.Response:
        r = requests.request(method, self.srv.url + path, headers=self.srv.headers(who), timeout=900, **kw)
        return self.answer(f"{who} {method} {path} {kw.get('params') or ''}", r)


def _label(path: Path, image: Path) -> Path:
    img = nib.load(str(image))
    data = np.zeros(img.shape[:3], np.uint8)
    data[2:8, 2:8, 2:6] = 1
    nib.save(nib.Nifti1Image(data, img.affine), str(path))
    return path


def _filled(path: str, ids: dict[str, str]) -> str:
    return re.sub(r"\{([^}:]+)(?::path)?\}", lambda m: ids.get(m.group(1), "x"), path)


def _enum(schema: dict, components: dict) -> list | None:
    """The values of an enum parameter (inline, behind a $ref, or in an anyOf with null)."""
    for s in [schema] + schema.get("anyOf", []):
        if "$ref" in s:
            s = components.get(s["$ref"].rsplit("/", 1)[-1], {})
        if s.get("enum"):
            return s["enum"]
    return None


def _query(op: dict, ids: dict[str, str], components: dict) -> list[dict]:
    """Query parameters for one call per value of an enum (e.g. `output`), ids for the rest."""
    params: dict = {}
    variants = [{}]
    for p in op.get("parameters", []):
        if p.get("in") != "query":
            continue
        name = p["name"]
        enum = _enum(p.get("schema", {}), components)
        if enum:
            variants = [{**v, name: e} for v in variants for e in enum]
        elif name in ids:
            params[name] = ids[name]
    return [{**params, **v} for v in variants]


def test_no_answer_names_a_server_path(srv, tmp_path):
    walk = Walk(srv)
    image_file = srv.studies / f"{IMAGE}.nii.gz"
    # What a client does: infer, ask for the next study, save a label, open a session.
    r = walk.call("POST", f"/infer/{MODEL}", "ann", params={"image": IMAGE, "output": "json"})
    assert r.status_code == 200, r.text[:500]
    r = walk.call("POST", f"/infer/{MODEL}", "ann", params={"output": "json"},
                  files={"file": ("upload.nii.gz", image_file.read_bytes())})
    assert r.status_code == 200, r.text[:500]
    strategies = walk.call("GET", "/info/", "ann").json()["strategies"]
    for strategy in strategies:
        r = walk.call("POST", f"/activelearning/{strategy}", "ann", json={})
        assert r.status_code == 200, (strategy, r.text[:500])
    label = _label(tmp_path / "l.nii.gz", image_file)
    r = walk.call("PUT", "/datastore/label", "rev", params={"image": IMAGE, "tag": "final"},
                  files={"label": ("l.nii.gz", label.read_bytes())})
    assert r.status_code == 200, r.text[:500]
    r = walk.call("PUT", "/datastore/label", "ann", params={"image": IMAGE, "tag": "draft"},
                  files={"label": ("l.nii.gz", label.read_bytes())})
    assert r.status_code == 200, r.text[:500]
    r = walk.call("PUT", "/session/", "ann", files={"files": ("s.nii.gz", image_file.read_bytes())})
    assert r.status_code == 200, r.text[:500]
    session_id = r.json()["session_id"]
    r = walk.call("PUT", "/datastore/image/info", "adm", params={"image": IMAGE}, data={"info": '{"note": "x"}'})
    assert r.status_code == 200, r.text[:500]
    r = walk.call("PUT", "/datastore/label/info", "rev", params={"label": IMAGE, "tag": "final"},
                  data={"info": '{"note": "x"}'})
    assert r.status_code == 200, r.text[:500]

    # Every GET route, with real ids.
    ids = {"image": IMAGE, "label": IMAGE, "id": IMAGE, "tag": "final", "model": MODEL, "session_id": session_id,
           "strategy": next(iter(strategies)), "name": MODEL, "path": "studies", "text": "true"}
    schema = requests.get(f"{srv.url}/openapi.json", timeout=30).json()
    gets = 0
    for path, item in schema["paths"].items():
        op = item.get("get")
        if op is None:
            continue
        for params in _query(op, ids, schema.get("components", {}).get("schemas", {})):
            walk.call("GET", _filled(path, ids), params=params)
            gets += 1
    assert gets > 15, gets
    assert any("'output': 'train'" in c for c in walk.checked), walk.checked  # every output of /datastore/
    for path in HIDDEN_GETS:
        walk.call("GET", path)
    for who in ("ann", "rev"):
        walk.call("GET", "/info/", who)
    assert walk.call("DELETE", f"/session/{session_id}", "ann").status_code == 200
    print(f"{len(walk.checked)} answers checked")
    assert not walk.found, "server paths in answers:\n" + "\n".join(dict.fromkeys(walk.found))


def test_the_viewers_files_arrive_as_packaged(srv):
    """OHIF's page, scripts and styles are the monailabel package's own: sent byte for byte, never cleaned (a rewrite
    of the `/`-led strings in its bundles left the viewer blank)."""
    import monailabel

    ohif = Path(monailabel.__file__).parent / "endpoints" / "static" / "ohif"
    files = ["index.html", "app-config.js", sorted(p.name for p in ohif.glob("*.bundle.*.js"))[0],
             sorted(p.name for p in ohif.glob("*.css"))[0]]
    for name in files:
        r = requests.get(f"{srv.url}/ohif/{name}", headers=srv.headers("ann"), timeout=60)
        assert r.status_code == 200, (name, r.status_code)
        assert r.content == (ohif / name).read_bytes(), f"/ohif/{name} differs from the packaged file"
