"""README's "Two commands", run as a newcomer runs them: the commands it shows exist, the first one starts a server
at the address README gives, and every URL of that section answers there. So README cannot drift from the scripts.

`scripts/run-server` runs for real (venv check, `rocm-zoo sample`, `rocm-zoo serve`) from a scratch copy of the
checkout's layout (its scripts, pyproject.toml and .venv linked), so the sample data lands in a temp folder, not in
the checkout; on a free port (README names PORT for that), stopped once the URLs are checked."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time

import pytest
import requests

from zoo_test_support import REPO, free_port

pytestmark = pytest.mark.slow

README = REPO / "README.md"
DEFAULT_URL = "http://127.0.0.1:8000"


def two_commands_section() -> str:
    text = README.read_text()
    start = text.index("## Two commands")
    return text[start:text.index("\n## ", start + 1)]


def shown_commands(section: str) -> list[str]:
    """The section's code lines (indented four spaces), as README shows them."""
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_the_two_commands_exist_and_ci_runs_the_second():
    commands = shown_commands(two_commands_section())
    assert commands == ["scripts/run-server", "scripts/run-tests"], commands
    for command in commands:
        assert os.access(REPO / command, os.X_OK), f"{command} is not an executable file"
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("exec scripts/run-tests")
    run_server = (REPO / "scripts" / "run-server").read_text()
    assert '--host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"' in run_server, "README's address is the default"


def test_run_server_answers_at_every_url_readme_gives(tmp_path):
    marker = REPO / ".venv" / ".rocm-zoo-installed"
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    # scripts/run-tests sets the venv up first; a stale one would be rebuilt here, from the scratch copy
    assert marker.exists() and marker.read_text().strip() == stamp, "run scripts/setup-venv first"
    section = two_commands_section()
    paths = sorted({u[len(DEFAULT_URL):] or "/" for u in re.findall(re.escape(DEFAULT_URL) + r"[^\s`)'\"]*", section)})
    assert paths, "the section names no URL"
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("scripts", ".venv", "pyproject.toml"):
        (checkout / name).symlink_to(REPO / name)
    port = free_port()
    log = tmp_path / "run-server.log"
    env = {k: v for k, v in os.environ.items() if k != "HOST"} | {"PORT": str(port), "PYTHONUNBUFFERED": "1",
                                                                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(checkout / "scripts" / "run-server")], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while f"Uvicorn running on {url}" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "scripts/run-server did not start serving in 10 minutes"
            time.sleep(1)
        assert (checkout / "sample-data" / "studies").is_dir() and (checkout / "apps" / "rocm_zoo" / "main.py").exists()
        for path in paths:
            r = requests.get(url + path, timeout=60)
            if path.startswith("/health/ready") and r.status_code == 503:  # still compiling: it says what
                assert set(r.json()["models"]) >= {"spleen_deepedit", "vista3d"}, r.text
                continue
            assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:200]}"
        studies = requests.get(f"{url}/datastore/", params={"output": "all"}, timeout=60).json()["objects"]
        assert "phantom_spleen10" in studies, sorted(studies)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
