"""Login tokens: JWTs signed (HS256) with a secret kept next to the user file, expiring after `--conf token_hours`.

The claims are laid out as Keycloak's (`preferred_username`, `realm_access.roles`), which is what MONAI Label reads;
`gen` is the user's token generation, so a password change or `rocm-zoo users revoke` ends the tokens issued before.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import jwt

ISSUER = "rocm_zoo"


def load_secret(path: Path) -> bytes:
    """The server's signing secret (created once, 0600); tokens stay valid across restarts."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_bytes()
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    return path.read_bytes()


def issue(secret: bytes, username: str, roles: list[str], hours: float, now: float | None = None,
          generation: str = "") -> str:
    """`generation`: the user's token generation (users.LocalUser), checked at every request."""
    now = time.time() if now is None else now
    claims = {"iss": ISSUER, "sub": username, "preferred_username": username, "realm_access": {"roles": roles},
              "iat": int(now), "exp": int(now + hours * 3600), "gen": generation}
    return jwt.encode(claims, secret, algorithm="HS256")


def verify(secret: bytes, token: str) -> dict:
    """The token's claims; jwt.InvalidTokenError (expired, wrong signature, malformed) otherwise."""
    return jwt.decode(token, secret, algorithms=["HS256"], issuer=ISSUER,
                      options={"require": ["exp", "iat", "sub"]})
