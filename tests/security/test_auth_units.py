"""Issue 31 items 4, 8 and 9 without a server: the addresses log-in is decided from, the Host check, the log-in
brakes, token generations, and the route x role table that README shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocm_zoo.server.auth import LocalAuth, tokens
from rocm_zoo.server.auth.binding import bind_host, bind_hosts, decide
from rocm_zoo.server.auth.host_check import HostCheck, host_name, names_this_machine
from rocm_zoo.server.auth.roles import OPEN, ROUTE_ROLES, route_table
from rocm_zoo.server.auth.throttle import LoginThrottle, TooManyLogins
from rocm_zoo.server.auth.users import UserFile

README = Path(__file__).resolve().parents[2] / "README.md"


# --- item 8: every --host counts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, hosts", [
    (["--host", "127.0.0.1", "--host", "0.0.0.0"], ["127.0.0.1", "0.0.0.0"]),
    (["--host", "127.0.0.1", "-i", "10.0.0.5"], ["127.0.0.1", "10.0.0.5"]),
    (["-i127.0.0.1", "--host=::1", "--ho", "0.0.0.0"], ["127.0.0.1", "::1", "0.0.0.0"]),  # argparse's prefixes
    (["--hos=localhost"], ["localhost"]),
    (["--studies", "/data", "--port", "8000"], ["0.0.0.0"]),  # MONAI Label's default
])
def test_every_host_of_the_command_line(argv, hosts):
    assert bind_hosts(["monailabel", "start_server", *argv]) == hosts
    assert bind_host(["monailabel", "start_server", *argv]) == hosts[-1]  # what uvicorn binds (argparse's last)


def test_log_in_is_on_if_any_host_is_beyond_loopback():
    assert decide("auto", ["127.0.0.1", "0.0.0.0"], keycloak=False) == "local"
    assert decide("auto", ["0.0.0.0", "127.0.0.1"], keycloak=False) == "local"
    assert decide("auto", ["127.0.0.1", "localhost", "::1", "[::1]"], keycloak=False) == "off"
    assert decide("auto", ["127.0.0.1", "myhost"], keycloak=False) == "local"
    assert decide("off", ["0.0.0.0"], keycloak=False) == "off"


# --- item 8: DNS rebinding ----------------------------------------------------------------------------------------

def test_host_names_of_this_machine():
    for ok in ("localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:8000", "127.5.6.7:1", "[::1]", "[::1]:8000",
               "localhost."):
        assert names_this_machine(ok), ok
    for bad in ("evil.example", "evil.example:8000", "", "127.0.0.1.evil.example", "localhost.evil.example",
                "[::1]x", "127.0.0.1:80:80", "10.0.0.1", "0.0.0.0", "[::]:8000", "127.0.0.1@evil.example"):
        assert not names_this_machine(bad), bad
    assert names_this_machine("gw.hospital.example:443", ("gw.hospital.example",))
    assert host_name("[::1]:8000") == "::1" and host_name("Example.ORG:1") == "example.org"


def _app(**kwargs):
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/datastore/")(lambda: {"objects": {}})
    app.add_middleware(HostCheck, **kwargs)
    return app


def test_host_check_middleware():
    from fastapi.testclient import TestClient

    client = TestClient(_app(allowed_hosts=("gw.hospital.example",)), base_url="http://127.0.0.1:8000")
    assert client.get("/datastore/").status_code == 200
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "gw.hospital.example"):
        assert client.get("/datastore/", headers={"Host": host}).status_code == 200, host
    r = client.get("/datastore/", headers={"Host": "evil.example:8000"})
    assert r.status_code == 421 and "allowed_hosts" in r.json()["detail"] and "objects" not in r.text
    # with log-in off on loopback, only this machine's clients (TestClient's client is "testclient")
    strict = TestClient(_app(loopback_clients_only=True), base_url="http://127.0.0.1:8000")
    r = strict.get("/datastore/")
    assert r.status_code == 403 and "loopback" in r.json()["detail"]


# --- item 9: brakes on guessing -----------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _fail(throttle, user="ann", address="10.0.0.9"):
    throttle.admit(user, address)  # counted as failed until succeeded()


def test_waits_grow_after_a_few_failures_and_a_success_clears_them():
    clock = Clock()
    t = LoginThrottle(free=5, first_wait_s=1, max_wait_s=8, clock=clock)
    for _ in range(5):
        _fail(t)
    waits = []
    for _ in range(6):
        with pytest.raises(TooManyLogins) as e:
            _fail(t)
        assert e.value.status == 429
        waits.append(e.value.retry_after_s)
        clock.now += e.value.retry_after_s
        _fail(t)
    assert waits == [1, 2, 4, 8, 8, 8], waits  # doubling, capped
    with pytest.raises(TooManyLogins):
        t.admit("ann", "10.0.0.9")  # the right password waits too: admit comes before the password is checked
    _fail(t, address="10.0.0.10")  # another address is not held back by this one
    clock.now += 8
    t.admit("ann", "10.0.0.9")
    t.succeeded("ann", "10.0.0.9")
    assert t.failures("ann", "10.0.0.9") == 0
    for _ in range(5):
        _fail(t)  # five free failures again


def test_a_burst_is_held_back_like_a_sequence():
    t = LoginThrottle(free=5, clock=Clock())
    admitted = 0
    for _ in range(40):  # 40 concurrent guesses: none has failed yet when the next is admitted
        try:
            t.admit("ann", "10.0.0.9")
            admitted += 1
        except TooManyLogins:
            pass
    assert admitted == 5


def test_one_address_spraying_names_is_held_back_and_memory_stays_bounded():
    t = LoginThrottle(free=5, free_per_address=20, max_keys=100, clock=Clock())
    refused = 0
    for i in range(1000):
        try:
            t.admit(f"user{i}", "10.0.0.9")
        except TooManyLogins:
            refused += 1
    assert refused == 1000 - 20
    for i in range(5000):
        try:
            t.admit(f"user{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
        except TooManyLogins:
            pass
    assert len(t) <= 100


def test_failures_are_forgotten_after_a_while():
    clock = Clock()
    t = LoginThrottle(free=2, forget_after_s=60, max_wait_s=10, clock=clock)
    _fail(t), _fail(t)
    with pytest.raises(TooManyLogins):
        _fail(t)
    clock.now += 61
    _fail(t), _fail(t)


def test_failed_log_ins_are_logged_and_throttled(tmp_path, caplog):
    users = UserFile(tmp_path / "users.json")
    users.add("ann", "annotator", "annotator-pw")
    auth = LocalAuth(users, b"s" * 32, 1, LoginThrottle(free=2, first_wait_s=30, clock=Clock()))
    from fastapi import HTTPException

    with caplog.at_level("WARNING"):
        for _ in range(2):
            with pytest.raises(HTTPException):
                auth.login("ann", "wrong-password", "10.0.0.9")
    assert sum("failed log-in as 'ann' from 10.0.0.9" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(TooManyLogins):
        auth.login("ann", "annotator-pw", "10.0.0.9")
    assert auth.login("ann", "annotator-pw", "10.0.0.8")["access_token"]


# --- item 9: a password change or revocation ends the tokens --------------------------------------------------------

def test_tokens_end_with_a_password_change_revocation_or_removal(tmp_path):
    from fastapi import HTTPException

    users = UserFile(tmp_path / "users.json")
    users.add("ann", "annotator", "annotator-pw")
    auth = LocalAuth(users, tokens.load_secret(tmp_path / "users.json.secret"), 1)

    def token():
        return auth.login("ann", "annotator-pw", "127.0.0.1")["access_token"]

    for change in (lambda: users.add("ann", "annotator", "annotator-pw", replace=True),  # even the same password
                   lambda: users.revoke("ann"),
                   lambda: (users.remove("ann"), users.add("ann", "annotator", "annotator-pw"))):
        old = token()
        assert auth.user_of(old).username == "ann"
        change()
        with pytest.raises(HTTPException) as e:
            auth.user_of(old)
        assert e.value.status_code == 401
        assert auth.user_of(token()).username == "ann"
    # a token without a generation (issued before this change, or forged with the secret's old format) is refused
    bare = tokens.issue(auth.secret, "ann", ["monailabel-user"], hours=1)
    with pytest.raises(HTTPException):
        auth.user_of(bare)
    assert not users.revoke("nobody")


def test_a_change_in_the_same_clock_tick_is_seen(tmp_path):
    users = UserFile(tmp_path / "users.json")
    users.add("ann", "annotator", "annotator-pw")
    before = users.get("ann").generation
    stamp = (tmp_path / "users.json").stat().st_mtime_ns
    other = UserFile(tmp_path / "users.json")
    other.revoke("ann")
    import os

    os.utime(tmp_path / "users.json", ns=(stamp, stamp))  # as if written within the same tick
    assert users.get("ann").generation != before


def test_the_users_file_and_secret_are_private(tmp_path):
    users = UserFile(tmp_path / "users.json")
    users.add("ann", "annotator", "annotator-pw")
    tokens.load_secret(tmp_path / "users.json.secret")
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "users.json.secret").stat().st_mode & 0o777 == 0o600


def test_keep_private(tmp_path):
    from rocm_zoo.server.auth import keep_private

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (logs / "app.log").write_text("image ids, user names")
    (logs / "app.log").chmod(0o644)
    secret = tmp_path / "users.json.secret"
    secret.write_bytes(b"x")
    secret.chmod(0o644)
    keep_private(tmp_path, (secret,))
    assert logs.stat().st_mode & 0o777 == 0o700
    assert (logs / "app.log").stat().st_mode & 0o777 == 0o600 and secret.stat().st_mode & 0o777 == 0o600


def test_keep_private_leaves_what_is_not_the_servers_own_file_alone(tmp_path):
    """A log handler writing to /dev/null, and a log that is a link to a shared file: a server running as root once
    made /dev/null 0600 for everyone (apt then failed)."""
    import logging
    import os

    from rocm_zoo.server.auth import keep_private

    shared = tmp_path / "shared.log"
    shared.write_text("someone else's")
    shared.chmod(0o644)
    logs = tmp_path / "app" / "logs"
    logs.mkdir(parents=True)
    (logs / "app.log").symlink_to(shared)
    devnull_mode = os.stat(os.devnull).st_mode
    handler = logging.FileHandler(os.devnull)
    logging.getLogger("rocm_zoo.test_keep_private").addHandler(handler)
    try:
        keep_private(tmp_path / "app")
        assert os.stat(os.devnull).st_mode == devnull_mode
    finally:
        logging.getLogger("rocm_zoo.test_keep_private").removeHandler(handler)
        handler.close()
        os.chmod(os.devnull, devnull_mode & 0o7777)
    assert shared.stat().st_mode & 0o777 == 0o644 and logs.stat().st_mode & 0o777 == 0o700


# --- item 4: the route x role table ---------------------------------------------------------------------------------

def test_readme_shows_the_route_roles_in_force():
    assert route_table() in README.read_text(), "README's route x role table differs from roles.ROUTE_ROLES: paste " \
                                                "rocm_zoo.server.auth.route_table()"


def test_what_annotators_may_not_do():
    admin_only = [("PUT", "/datastore/image"), ("PUT", "/datastore/"), ("PUT", "/datastore/image/info"),
                  ("GET", "/datastore/dataset"), ("GET", "/model/{model}"),
                  ("POST", "/proxy/dicom/stow/{path:path}"), ("POST", "/reload"), ("GET", "/logs/")]
    for key in admin_only:
        assert ROUTE_ROLES[key] == "admin", key
    assert {r for r in ROUTE_ROLES.values()} <= {OPEN, "user", "annotator", "reviewer", "admin"}
