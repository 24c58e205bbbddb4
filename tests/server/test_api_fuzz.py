"""The whole HTTP API fuzzed from its own OpenAPI schema with Schemathesis, against a real server (log-in on, an admin
token, CPU, the tiny wholeBody_ct bundle): no answer is a 5xx, and the server still serves afterwards.

Bounded: a few examples per operation and a time budget for the run. Left out: starting a training run (`/train/`:
minutes of CPU per example). The run's figures (requests tried, failures) are printed and kept in
`<tmp>/fuzz/schemathesis.txt`."""

from __future__ import annotations

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
MAX_TIME_S = 240


def _schemathesis() -> str:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return str(exe)
    found = shutil.which("schemathesis")
    if not found:
        pytest.skip("schemathesis is not installed (pip install '.[test]')")
    return found


def test_no_request_gets_a_5xx(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    studies = secure_server.copy_studies(sample_env, root / "studies")
    users_file = root / "auth" / "users.json"
    secure_server.add_users(users_file)
    with secure_server.running(sample_env, studies, root / "server.log",
                               {"auth": "on", "max_upload_mb": "8", "warmup": "false"}, users_file) as srv:
        token = srv.token("adm")
        cmd = [_schemathesis(), "run", f"{srv.url}/openapi.json", "--url", srv.url,
               "-H", f"Authorization: Bearer {token}", "--checks", "not_a_server_error",
               "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S), "--seed", "15",
               "--exclude-path-regex", "^/train/", "--phases", "examples,coverage,fuzzing",
               "--request-timeout", "120", "--no-color"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=MAX_TIME_S + 300, cwd=root)
        out = run.stdout + run.stderr
        (root / "schemathesis.txt").write_text(out)
        figures = re.search(r"(\d+) generated, (?:(\d+) found (\d+) unique failures?|.*)", out)
        print(f"schemathesis: {figures.group(0) if figures else '(no summary)'}; exit {run.returncode}")
        assert figures and int(figures.group(1)) > 500, out[-3000:]
        assert run.returncode == 0, out[-6000:]
        # alive afterwards, and still answering properly
        assert requests.get(f"{srv.url}/auth/", timeout=30).status_code == 200
        assert requests.get(f"{srv.url}/info/", headers=srv.headers("ann"), timeout=60).status_code == 200
        assert requests.get(f"{srv.url}/info/", timeout=60).status_code == 401
        assert srv.proc.poll() is None
