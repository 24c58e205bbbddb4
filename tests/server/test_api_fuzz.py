"""The whole HTTP API fuzzed from its own OpenAPI schema with Schemathesis, against a real server (log-in on, an admin
token, CPU, the tiny wholeBody_ct bundle): no answer is a 5xx, and the server still serves afterwards.

The schema fuzzed is the server's /openapi.json plus the routes it leaves out (`include_in_schema=False`: /reload,
the deprecated datastore routes, /ohif/*, /proxy/dicom/*, ...), described from MONAI Label's own route objects. A
server fault is never passed off as a client error: http_errors maps to 4xx only errors raised where MONAI Label
reads the request, and logs each one with where it was raised; the test lists them.

Bounded: a few examples per operation and a time budget for the run. Left out: starting a training run (`/train/`:
minutes of CPU per example). The run's figures (requests tried, failures) are printed and kept in
`<tmp>/fuzz/schemathesis.txt`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import secure_server

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 5
MAX_TIME_S = 150  # the run checks below that every selected operation was tested within it


def _schemathesis() -> str:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return str(exe)
    found = shutil.which("schemathesis")
    if not found:
        pytest.skip("schemathesis is not installed (pip install '.[test]')")
    return found


def _hidden_operations() -> dict:
    """OpenAPI paths of MONAI Label's routes that its schema leaves out, as if they were in it."""
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute
    from monailabel.app import app

    def routes(rs):
        for r in rs:
            inner = getattr(r, "original_router", None)
            yield from routes(inner.routes) if inner is not None else (r,)

    hidden = [r for r in routes(app.router.routes) if isinstance(r, APIRoute) and not r.include_in_schema]
    assert len(hidden) > 10, [r.path for r in hidden]
    for r in hidden:
        r.include_in_schema = True  # in this process only: a description of the routes, for the fuzzer
    try:
        return get_openapi(title="hidden", version="0", routes=hidden)
    finally:
        for r in hidden:
            r.include_in_schema = False


def full_schema(url: str, out: Path) -> tuple[Path, list[str]]:
    """The server's schema with the left-out routes added (a bearer token on each, no `token` parameter)."""
    schema = requests.get(f"{url}/openapi.json", timeout=30).json()
    hidden = _hidden_operations()
    added = []
    for path, ops in hidden["paths"].items():
        known = schema["paths"].setdefault(path, {})
        for method, op in ops.items():
            if method in known:
                continue
            op["parameters"] = [p for p in op.get("parameters", []) if p.get("name") != "token"]
            op["security"] = [{"OAuth2PasswordBearer": []}]
            op.pop("deprecated", None)  # fuzzed like the rest
            known[method] = op
            added.append(f"{method.upper()} {path}")
    for name, component in hidden.get("components", {}).get("schemas", {}).items():
        schema.setdefault("components", {}).setdefault("schemas", {}).setdefault(name, component)
    out.write_text(json.dumps(schema))
    return out, added


def test_no_request_gets_a_5xx(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    with secure_server.serving(sample_env, root, {"auth": "on", "max_upload_mb": "8", "warmup": "false"}) as srv:
        token = srv.token("adm")
        annotator = srv.headers("ann")  # before the fuzzer's wrong log-ins slow this address down (429)
        schema, added = full_schema(srv.url, root / "schema.json")
        assert {"POST /reload", "PUT /datastore/", "GET /ohif/{path}"} <= set(added), added
        cmd = [_schemathesis(), "run", str(schema), "--url", srv.url,
               "-H", f"Authorization: Bearer {token}", "--checks", "not_a_server_error",
               "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S), "--seed", "15",
               "--exclude-path-regex", "^/train/", "--phases", "examples,coverage,fuzzing",
               "--request-timeout", "120", "--no-color"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=MAX_TIME_S + 300, cwd=root)
        out = run.stdout + run.stderr
        (root / "schemathesis.txt").write_text(out)
        figures = re.search(r"(\d+) generated, (?:(\d+) found (\d+) unique failures?|.*)", out)
        print(f"schemathesis: {figures.group(0) if figures else '(no summary)'}; exit {run.returncode}")
        mapped = re.findall(r"-> 4\d\d: \w+ raised at .*", (root / "server.log").read_text())
        print(f"{len(added)} routes left out of /openapi.json fuzzed too; errors answered as client errors: "
              f"{sorted(set(m.split(': ', 2)[1] for m in mapped))}")
        assert figures and int(figures.group(1)) > 500, out[-3000:]
        operations = re.search(r"Selected: (\d+)/\d+\s+Tested: (\d+)", out)
        assert operations and operations.group(1) == operations.group(2), f"operations left untested: {out[-3000:]}"
        assert run.returncode == 0, out[-6000:]
        # alive afterwards, and still answering properly
        assert requests.get(f"{srv.url}/auth/", timeout=30).status_code == 200
        assert requests.get(f"{srv.url}/info/", headers=annotator, timeout=60).status_code == 200
        assert requests.get(f"{srv.url}/info/", timeout=60).status_code == 401
        assert srv.proc.poll() is None
