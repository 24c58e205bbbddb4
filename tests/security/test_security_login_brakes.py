"""Issue 31 item 9 on a real server (log-in on, loopback): guessing a password is logged and slowed (429 with a
growing Retry-After, the right password refused too while it lasts), a password change or `rocm-zoo users revoke`
ends the tokens issued before, and the user file, its secret and the logs are the server's account's only."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

import secure_server
from rocm_zoo.server.auth.users import UserFile

pytestmark = pytest.mark.slow

GUESSED = ("guess", "the-right-pw")
CHANGED = ("change", "first-password")


@pytest.fixture(scope="module")
def srv(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("brakes")
    studies = secure_server.copy_studies(sample_env, root / "studies", ("phantom_test0",))
    users_file = root / "auth" / "users.json"
    secure_server.add_users(users_file)
    users = UserFile(users_file)
    for name, password in (GUESSED, CHANGED):
        users.add(name, "annotator", password)
    with secure_server.running(sample_env, studies, root / "server.log", {"auth": "on", "warmup": "false"},
                               users_file) as server:
        yield server


def _login(srv, name, password):
    return requests.post(f"{srv.url}/auth/token", data={"username": name, "password": password}, timeout=30)


def test_guessing_is_logged_and_slowed(srv):
    name, right = GUESSED
    codes = [_login(srv, name, f"wrong-{i}").status_code for i in range(5)]
    assert codes == [401] * 5, codes
    r = _login(srv, name, "wrong-5")
    assert r.status_code == 429 and r.headers.get("Retry-After") == "1", (r.status_code, r.headers, r.text)
    assert "try again" in r.json()["detail"]
    r = _login(srv, name, right)  # the right password waits too
    assert r.status_code == 429, r.text
    time.sleep(1.1)
    assert _login(srv, name, "wrong-6").status_code == 401
    r = _login(srv, name, "wrong-7")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) == 2, r.headers  # growing
    time.sleep(int(r.headers["Retry-After"]) + 0.1)
    r = _login(srv, name, right)
    assert r.status_code == 200, r.text
    assert _login(srv, name, "wrong-8").status_code == 401  # a success cleared the count
    log = srv.log.read_text()
    failed = [line for line in log.splitlines() if f"failed log-in as '{name}' from 127.0.0.1" in line]
    assert len(failed) == 7 and all("WARNING" in line for line in failed), failed  # each 401
    held = [line for line in log.splitlines() if f"log-in as '{name}' from 127.0.0.1 refused" in line]
    assert len(held) == 3 and all("WARNING" in line for line in held), held  # each 429
    # other users from the same address are not held back by one user's failures
    assert _login(srv, "adm", secure_server.PASSWORDS["adm"]).status_code == 200


def _users_cli(srv, *args, stdin=""):
    cmd = [sys.executable, "-m", "rocm_zoo.cli", "users", *args, "--users-file", str(srv.users_file)]
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_password_change_or_revocation_ends_the_tokens(srv):
    name, first = CHANGED

    def token(password):
        r = _login(srv, name, password)
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['access_token']}"}

    def works(headers):
        code = requests.get(f"{srv.url}/info/", headers=headers, timeout=30).status_code
        assert code in (200, 401), code
        return code == 200

    old = token(first)
    assert works(old)
    out = _users_cli(srv, "add", name, "--role", "annotator", "--replace", "--password-stdin",
                     stdin="second-password\n")
    assert "stop working" in out
    assert not works(old)
    assert _login(srv, name, first).status_code == 401
    new = token("second-password")
    assert works(new)
    _users_cli(srv, "revoke", name)
    assert not works(new)
    assert works(token("second-password"))  # the password stays


def test_secrets_and_logs_are_private(srv, sample_env):
    for path in (srv.users_file, srv.users_file.with_name(srv.users_file.name + ".secret")):
        assert path.stat().st_mode & 0o777 == 0o600, (path.name, oct(path.stat().st_mode))
    logs = sample_env.app_dir / "logs"
    assert logs.stat().st_mode & 0o777 == 0o700, oct(logs.stat().st_mode)
    for f in logs.iterdir():
        assert f.stat().st_mode & 0o077 == 0, (f.name, oct(f.stat().st_mode))
