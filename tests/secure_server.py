"""A real server for the security tests (a plain module beside zoo_test_support, so test modules of every folder
import it): a copy of the sample studies, its own user file, wholeBody_ct only (tiny, CPU; an automatic model warms in
the background, so the server answers at once), started as `monailabel start_server` on loopback and, unlike the
shared fixture, reachable as a process (kill -9)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from rocm_zoo.server.auth import tokens
from rocm_zoo.server.auth.users import UserFile, monailabel_roles
from zoo_test_support import free_port

MODEL = "wholeBody_ct"
PASSWORDS = {"ann": "annotator-pw", "rev": "reviewer-pw", "adm": "admin-pw-1"}
ROLES = {"ann": "annotator", "rev": "reviewer", "adm": "admin"}


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    studies: Path
    users_file: Path
    log: Path

    def token(self, name: str) -> str:
        r = requests.post(f"{self.url}/auth/token", data={"username": name, "password": PASSWORDS[name]}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["access_token"]

    def headers(self, name: str) -> dict:
        return {"Authorization": f"Bearer {self.token(name)}"}

    def expired_token(self, name: str) -> str:
        """Signed with the server's own secret, expired an hour ago."""
        secret = tokens.load_secret(self.users_file.with_name(self.users_file.name + ".secret"))
        return tokens.issue(secret, name, monailabel_roles(ROLES[name]), hours=1, now=time.time() - 7200)


def copy_studies(sample_env, folder: Path, names: tuple[str, ...] | None = None) -> Path:
    folder.mkdir(parents=True)
    for f in sample_env.paths.studies.glob("*.nii.gz"):
        if names is None or f.name.split(".")[0] in names:
            shutil.copy(f, folder / f.name)
    return folder


def add_users(users_file: Path) -> None:
    users = UserFile(users_file)
    for name, role in ROLES.items():
        users.add(name, role, PASSWORDS[name], replace=True)


def start(sample_env, studies: Path | str, log: Path, conf: dict[str, str], users_file: Path | None = None,
          timeout_s: float = 600, env: dict[str, str] | None = None, hosts: tuple[str, ...] = ("127.0.0.1",)) -> Server:
    """The server on `studies` (a folder, or a DICOMweb URL); `env` is added to its environment; each of `hosts` is
    a `--host` (uvicorn binds the last; the tests connect to 127.0.0.1 whatever they are)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(sample_env.app_dir),
           "--studies", str(studies), "--conf", "models", MODEL, "--port", str(port)]
    for host in hosts:
        cmd += ["--host", host]
    if users_file is not None:
        cmd += ["--conf", "users_file", str(users_file)]
    for k, v in conf.items():
        cmd += ["--conf", k, v]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(sample_env.root / "inductor"),
               **(env or {}))
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, env=env)
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            # /auth/ answers whether auth is on or not; with auth on, /info/ would be 401
            if requests.get(f"{url}/auth/", timeout=5).status_code == 200:
                return Server(url, proc, Path(studies) if isinstance(studies, Path) else Path(), users_file or Path(),
                              log)
        except (requests.ConnectionError, requests.Timeout):
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"server not up after {timeout_s} s:\n{log.read_text()[-5000:]}")
        time.sleep(1)


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@contextmanager
def running(sample_env, studies: Path | str, log: Path, conf: dict[str, str], users_file: Path | None = None,
            env: dict[str, str] | None = None, hosts: tuple[str, ...] = ("127.0.0.1",)):
    server = start(sample_env, studies, log, conf, users_file, env=env, hosts=hosts)
    try:
        yield server
    finally:
        stop(server)


@contextmanager
def serving(sample_env, root: Path, conf: dict[str, str], *, images: tuple[str, ...] | None = None,
            users: bool = True, env: dict[str, str] | None = None, hosts: tuple[str, ...] = ("127.0.0.1",)):
    """The usual security-test server in `root`: a copy of the sample studies (or of `images`) in root/studies, the
    three users in root/auth/users.json unless `users` is False, its log in root/server.log."""
    studies = copy_studies(sample_env, root / "studies", images)
    users_file = None
    if users:
        users_file = root / "auth" / "users.json"
        add_users(users_file)
    with running(sample_env, studies, root / "server.log", conf, users_file, env=env, hosts=hosts) as server:
        yield server
