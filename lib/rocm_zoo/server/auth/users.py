"""The local user file: names, roles and scrypt password hashes (standard library only), so a team needs no Keycloak.

One JSON file, written atomically, readable by the server's account only (0600). Roles are the three of MONAI
Label's auth flow that people hold: annotator (infer, save labels), reviewer (also `final` labels), admin (also
train, batch, delete, logs, models). Each maps onto MONAI Label's role names, so its `RBAC` checks work unchanged.
Each user also has a token generation, new at every `add` (a password change) and `revoke`: tokens carry it, and
one of an older generation is refused, so changing a password or revoking logs that user out everywhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from rocm_zoo.engine.atomic_files import atomic_write_text
from rocm_zoo.errors import InvalidRequest

ROLES = ("annotator", "reviewer", "admin")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,63}$")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}  # ~16 MiB, ~50 ms per check: slow for guessing, fine for a login
MIN_PASSWORD = 8


def monailabel_roles(role: str) -> list[str]:
    """MONAI Label's role names a local role holds (each role holds the ones below it)."""
    from monailabel.config import settings as s

    held = [s.MONAI_LABEL_AUTH_ROLE_USER, s.MONAI_LABEL_AUTH_ROLE_ANNOTATOR]
    if role in ("reviewer", "admin"):
        held.append(s.MONAI_LABEL_AUTH_ROLE_REVIEWER)
    if role == "admin":
        held.append(s.MONAI_LABEL_AUTH_ROLE_ADMIN)
    return held


@dataclass(frozen=True)
class LocalUser:
    name: str
    role: str
    generation: str = ""  # changes with the password and at `revoke`; tokens of another generation are refused


def _generation(record: dict) -> str:
    """The record's token generation (a file written before generations existed: one derived from its salt, which
    also changes with the password)."""
    if record.get("generation"):
        return str(record["generation"])
    return hashlib.sha256(b"rocm_zoo generation " + str(record.get("salt", "")).encode()).hexdigest()[:16]


def _user(name: str, record: dict) -> LocalUser:
    return LocalUser(name, record["role"], _generation(record))


def _hash(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 2**20, dklen=32)


class UserFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime = None
        self._users: dict[str, dict] = {}

    def _load(self) -> dict[str, dict]:
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._users, self._mtime = {}, None
                return self._users
            # Every save is a new file renamed into place: the inode tells a change that the clock's tick hides.
            mtime = (st.st_mtime_ns, st.st_ino, st.st_size)
            if mtime != self._mtime:  # `rocm-zoo users` changed it: a removed user is out at the next request
                self._users = json.loads(self.path.read_text()).get("users", {})
                self._mtime = mtime
            return self._users

    def _save(self, users: dict[str, dict]) -> None:
        atomic_write_text(self.path, json.dumps({"users": users}, indent=2))  # its temporary file is made 0600

    def list(self) -> list[LocalUser]:
        return [_user(n, u) for n, u in sorted(self._load().items())]

    def get(self, name: str) -> LocalUser | None:
        u = self._load().get(name)
        return _user(name, u) if u else None

    def add(self, name: str, role: str, password: str, replace: bool = False) -> LocalUser:
        if not _NAME.match(name or ""):
            raise InvalidRequest(f"user name '{name}': letters, digits and _ . @ - (at most 64)")
        if role not in ROLES:
            raise InvalidRequest(f"role '{role}' is not one of {', '.join(ROLES)}")
        if len(password) < MIN_PASSWORD:
            raise InvalidRequest(f"the password needs at least {MIN_PASSWORD} characters")
        users = dict(self._load())
        if name in users and not replace:
            raise InvalidRequest(f"user '{name}' exists (to change the password or role, add it again with --replace)")
        salt = secrets.token_bytes(16)
        users[name] = {"role": role, "scrypt": dict(_SCRYPT), "salt": base64.b64encode(salt).decode(),
                       "hash": base64.b64encode(_hash(password, salt, **_SCRYPT)).decode(),
                       "generation": secrets.token_hex(8)}
        self._save(users)
        return _user(name, users[name])

    def revoke(self, name: str) -> bool:
        """Every token issued to `name` so far stops working (the password stays)."""
        users = dict(self._load())
        if name not in users:
            return False
        users[name] = {**users[name], "generation": secrets.token_hex(8)}
        self._save(users)
        return True

    def remove(self, name: str) -> bool:
        users = dict(self._load())
        if users.pop(name, None) is None:
            return False
        self._save(users)
        return True

    def check(self, name: str, password: str) -> LocalUser | None:
        """The user, if the password is theirs; None otherwise (same work for an unknown name)."""
        u = self._load().get(name or "")
        salt = base64.b64decode(u["salt"]) if u else b"\0" * 16
        params = u["scrypt"] if u else _SCRYPT
        expected = base64.b64decode(u["hash"]) if u else b"\1" * 32
        ok = hmac.compare_digest(_hash(password or "", salt, **params), expected)
        return _user(name, u) if u and ok else None
