"""Log in as MONAI Label's viewers expect: its `/auth/` flow, backed by a local user file (or its own Keycloak).

- `GET /auth/` says whether auth is on; `POST /auth/token` (form: username, password) returns a bearer
  `access_token`; `GET /auth/token/valid` returns the token's user. 3D Slicer asks for the password, OHIF sends the
  token: both unchanged.
- Mode (`--conf auth auto|on|off`): `auto` is off on loopback and on as soon as the server listens beyond it: any
  `--host` of `monailabel start_server` beyond loopback (`binding`; MONAI Label's default is 0.0.0.0). A site with
  Keycloak sets MONAI Label's own `MONAI_LABEL_AUTH_ENABLE=true` (and its realm settings): then MONAI Label's
  Keycloak flow runs as shipped.
- On loopback, requests must be addressed to this machine (`host_check`: DNS rebinding), and with log-in off come
  from it.
- Local mode: routes keep their `Depends(RBAC(role))`; `get_current_user` is overridden (FastAPI dependency
  overrides) to read our tokens, and MONAI Label's auth switch is turned on so `RBAC` checks roles.
- Roles: `roles.ROUTE_ROLES` names the least role of every route (README's table is made from it).
- Failed log-ins are logged and slowed (`throttle`: 429 with Retry-After); a password change, `rocm-zoo users
  revoke` or removal ends the user's tokens (`users`: token generations).
- The user file, its secret and the server's logs are readable by the server's account only.
- Log-ins, failed and throttled ones too, go to the audit trail (`server.audit`), and each checked token leaves its
  user and role in the request's state for the trail's entry of that request.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Optional

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.security import OAuth2PasswordBearer, OAuth2PasswordRequestForm
from jwt import InvalidTokenError
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User, get_current_user

from rocm_zoo.server.audit.routes import STATE_USER
from rocm_zoo.server.audit.trail import AuditTrail
from rocm_zoo.server.auth import host_check, tokens
from rocm_zoo.server.auth.binding import all_loopback, bind_host, bind_hosts, decide, is_loopback
from rocm_zoo.server.auth.roles import ROUTE_ROLES, apply_route_roles, install_label_routes, route_table
from rocm_zoo.server.auth.throttle import LoginThrottle, TooManyLogins
from rocm_zoo.server.auth.users import ROLES, LocalUser, UserFile, monailabel_roles

__all__ = ["LocalAuth", "LoginThrottle", "ROUTE_ROLES", "TooManyLogins", "all_loopback", "bind_host", "bind_hosts",
           "decide", "install", "install_label_route", "is_loopback", "restrict_cors", "route_table", "users_path"]

logger = logging.getLogger(__name__)

install_label_route = install_label_routes  # the name app.py calls


def users_path(conf_users_file: str, app_dir: str | Path) -> Path:
    return Path(conf_users_file) if conf_users_file else Path(app_dir) / "users.json"


def keep_private(app_dir: str | Path, files: tuple[Path, ...] = ()) -> None:
    """The server's logs folder (MONAI Label's `<app>/logs`, 0700), the files in it and every file a log handler
    writes (0600), and `files` (the user file and its secret, 0600): image ids, user names and password hashes are
    for the server's account only."""
    logs = Path(app_dir) / "logs"
    targets = [p for p in logs.iterdir() if p.is_file()] if logs.is_dir() else []
    for lg in [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values()
                                        if isinstance(v, logging.Logger)]:
        targets += [Path(h.baseFilename) for h in lg.handlers if getattr(h, "baseFilename", None)]
    for path, mode in [(logs, 0o700)] + [(p, 0o600) for p in (*targets, *files)]:
        try:
            # Only the server's own regular files and its logs folder, never through a link: a handler may write to
            # /dev/null or a shared file, and a root server must not take those away from everyone else.
            info = path.lstat() if os.path.lexists(path) else None
            kind_ok = info is not None and (stat.S_ISDIR(info.st_mode) if mode == 0o700 else stat.S_ISREG(info.st_mode))
            if kind_ok and info.st_uid == os.getuid() and info.st_mode & 0o777 != mode:
                os.chmod(path, mode, follow_symlinks=False)
        except OSError as e:
            logger.warning("rocm_zoo auth: could not make %s private: %s", path.name, e)


class LocalAuth:
    """Tokens for the users of the local user file."""

    def __init__(self, users: UserFile, secret: bytes, token_hours: float, throttle: LoginThrottle | None = None,
                 trail: AuditTrail | None = None):
        self.users = users
        self.secret = secret
        self.token_hours = token_hours
        self.throttle = throttle if throttle is not None else LoginThrottle()
        self.trail = trail

    def _audit(self, event: str, username: str, address: str, client: str, **details) -> None:
        if self.trail is not None:
            self.trail.record(event, {"user": username[:64], "role": details.pop("role", None), "address": address,
                                      "client": client[:120]}, **details)

    def login(self, username: str, password: str, address: str = "?", client: str = "") -> dict:
        username = str(username or "")[:200]
        try:
            self.throttle.admit(username, address)  # TooManyLogins (429) while this user/address pair must wait
        except TooManyLogins as e:
            logger.warning("auth: log-in as %r from %s refused for %d s after repeated failures", username[:64],
                           address, e.retry_after_s)
            self._audit("login.throttled", username, address, client, retry_after_s=e.retry_after_s)
            raise
        user = self.users.check(username, password)
        if user is None:
            failures = self.throttle.failures(username, address)
            logger.warning("auth: failed log-in as %r from %s (%d failed in a row)", username[:64], address, failures)
            self._audit("login.failed", username, address, client, failed_in_a_row=failures)
            raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Wrong user name or password",
                                headers={"WWW-Authenticate": "Bearer"})
        self.throttle.succeeded(username, address)
        token = tokens.issue(self.secret, user.name, monailabel_roles(user.role), self.token_hours,
                             generation=user.generation)
        logger.info("auth: %s (%s) logged in from %s", user.name, user.role, address)
        self._audit("login", user.name, address, client, role=user.role)
        return {"access_token": token, "token_type": "bearer"}

    def user_of(self, token: Optional[str]) -> User:
        return self.local_user_of(token)[1]

    def local_user_of(self, token: Optional[str]) -> tuple[LocalUser, User]:
        unauthorized = HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Could not validate credentials",
                                     headers={"WWW-Authenticate": "Bearer"})
        if not token:
            raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Not authenticated: log in at "
                                "/auth/token", headers={"WWW-Authenticate": "Bearer"})
        try:
            claims = tokens.verify(self.secret, token)
        except InvalidTokenError as e:
            logger.info("auth: token refused: %s", e)
            raise unauthorized
        local = self.users.get(str(claims.get("sub")))
        if local is None:  # removed since the token was issued
            raise unauthorized
        if str(claims.get("gen", "")) != local.generation:  # password changed or revoked since
            logger.info("auth: token of %s refused: issued before the user's password change or revocation",
                        local.name)
            raise unauthorized
        # The role is the user file's now, not the token's: a changed role counts at once.
        return local, User(username=local.name, name=local.name, roles=monailabel_roles(local.role))


def install(web: FastAPI, config, app_dir: str | Path, trail: AuditTrail | None = None) -> str:
    """Sets up auth for this server; returns the mode (keycloak, local, off) after logging it. Log-ins, failed ones
    too, go to the audit `trail`."""
    hosts = bind_hosts()
    where = ", ".join(dict.fromkeys(hosts))
    loopback = all_loopback(hosts)
    mode = decide(config.auth, hosts, keycloak=bool(settings.MONAI_LABEL_AUTH_ENABLE))
    keep_private(app_dir)
    if loopback:
        host_check.install(web, config.allowed_hosts, loopback_clients_only=mode == "off")
    if mode == "keycloak":
        logger.warning("rocm_zoo auth: ON, MONAI Label's Keycloak flow (realm %s)", settings.MONAI_LABEL_AUTH_REALM_URI)
        apply_route_roles(web)
        return mode
    _install_routes(web, None)
    if mode == "off":
        apply_route_roles(web)
        why = "--conf auth off" if config.auth == "off" else f"listening on loopback ({where})"
        log = logger.info if loopback else logger.warning
        log("rocm_zoo auth: OFF (%s): every request is allowed%s", why,
            "" if loopback else "; ANYONE ON THE NETWORK CAN USE AND CHANGE THE DATASTORE")
        return mode
    path = users_path(config.users_file, app_dir)
    users = UserFile(path)
    secret = path.with_name(path.name + ".secret")
    local = LocalAuth(users, tokens.load_secret(secret), config.token_hours, trail=trail)
    keep_private(app_dir, (path, secret))
    _install_routes(web, local)
    settings.MONAI_LABEL_AUTH_ENABLE = True  # RBAC reads it at each request

    bearer = OAuth2PasswordBearer(tokenUrl="/auth/token", auto_error=False)

    async def current_user(request: Request, token: Optional[str] = Depends(bearer)) -> User:
        user, answer = local.local_user_of(token)
        setattr(request.state, STATE_USER, (user.name, user.role))  # who the audit trail's entry names
        return answer

    web.dependency_overrides[get_current_user] = current_user
    apply_route_roles(web)
    _document_bearer(web)
    count = len(users.list())
    why = "--conf auth on" if config.auth == "on" else f"listening beyond loopback ({where})"
    logger.warning("rocm_zoo auth: ON (%s): local users from %s (%d user%s), tokens valid %g h; roles %s",
                   why, path.name, count, "" if count == 1 else "s", config.token_hours, ", ".join(ROLES))
    if not count:
        logger.warning("rocm_zoo auth: no users yet, so nobody can log in: rocm-zoo users add NAME --role admin "
                       "--app %s", Path(app_dir).name)
    return mode


def _document_bearer(web: FastAPI) -> None:
    """The OpenAPI schema as the server now behaves: a bearer token from /auth/token on every operation but the open
    ones, and without the `token` query parameter MONAI Label's routes show when they are built with auth off."""
    build = web.openapi
    open_paths = ("/auth/", "/auth/token")

    def openapi():
        if web.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["OAuth2PasswordBearer"] = {
                "type": "oauth2", "flows": {"password": {"tokenUrl": "/auth/token", "scopes": {}}}}
            for path, ops in schema.get("paths", {}).items():
                for op in ops.values():
                    if not isinstance(op, dict):
                        continue
                    op["parameters"] = [p for p in op.get("parameters", [])
                                        if not (p.get("name") == "token" and p.get("in") == "query")]
                    if path not in open_paths and not path.startswith("/health"):
                        op["security"] = [{"OAuth2PasswordBearer": []}]
            web.openapi_schema = schema
        return web.openapi_schema

    web.openapi = openapi
    web.openapi_schema = None


def _install_routes(web: FastAPI, local: Optional[LocalAuth]) -> None:
    before = len(web.router.routes)

    @web.get("/auth/", summary="Check If Auth is Enabled", tags=["Auth"])
    async def auth_enabled():
        return {"enabled": local is not None, "client_id": settings.MONAI_LABEL_AUTH_CLIENT_ID,
                "realm": "rocm_zoo" if local else settings.MONAI_LABEL_AUTH_REALM_URI}

    @web.post("/reload", include_in_schema=False)
    def reload(user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))):
        """MONAI Label's /reload (drops the app instance: every model is built again) is open to anyone; admins only."""
        from monailabel.interfaces.utils.app import clear_cache

        clear_cache()
        return {}

    if local is not None:
        @web.post("/auth/token", summary="Log in: a bearer access token for username and password", tags=["Auth"])
        def access_token(request: Request, form_data: OAuth2PasswordRequestForm = Depends()):  # scrypt: a thread
            return local.login(form_data.username, form_data.password, request.client.host if request.client else "?",
                               request.headers.get("user-agent", ""))

        @web.get("/auth/token/valid", summary="The user of the current token", tags=["Auth"])
        async def valid_token(user: User = Depends(get_current_user)):
            return user.model_dump()

    _put_first(web, before)


def _put_first(web: FastAPI, before: int) -> None:
    """The routes added since `before` go ahead of MONAI Label's (FastAPI matches in order)."""
    ours = web.router.routes[before:]
    del web.router.routes[before:]
    web.router.routes[0:0] = ours
    web.openapi_schema = None


def restrict_cors(web: FastAPI, origins: tuple[str, ...]) -> None:
    """MONAI Label allows every origin (`*`, with credentials); here only the configured viewer origins, and none
    when none are configured (the viewers it serves itself, /ohif/, are same-origin; Slicer is not a browser)."""
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware

    kept = [m for m in web.user_middleware if getattr(m, "cls", None) is not CORSMiddleware]
    if origins:
        kept.insert(0, Middleware(CORSMiddleware, allow_origins=list(origins), allow_credentials=True,
                                  allow_methods=["*"], allow_headers=["*"]))
    web.user_middleware[:] = kept
    web.middleware_stack = None
    logger.info("rocm_zoo: CORS origins allowed: %s (in place of the \"Allow Origins: ['*']\" MONAI Label printed "
                "as it started)", ", ".join(origins) if origins else "none, same origin only")
