"""Log in as MONAI Label's viewers expect: its `/auth/` flow, backed by a local user file (or its own Keycloak).

- `GET /auth/` says whether auth is on; `POST /auth/token` (form: username, password) returns a bearer
  `access_token`; `GET /auth/token/valid` returns the token's user. 3D Slicer asks for the password, OHIF sends the
  token: both unchanged.
- Mode (`--conf auth auto|on|off`): `auto` is off on loopback and on as soon as the server listens beyond it (the
  `--host` of `monailabel start_server`; MONAI Label's default is 0.0.0.0). A site with Keycloak sets MONAI Label's
  own `MONAI_LABEL_AUTH_ENABLE=true` (and its realm settings): then MONAI Label's Keycloak flow runs as shipped.
- Local mode: MONAI Label's routes keep their `Depends(RBAC(role))`; `get_current_user` is overridden (FastAPI
  dependency overrides) to read our tokens, and MONAI Label's auth switch is turned on so `RBAC` checks roles.
- Roles: annotator (infer, save labels other than `final`), reviewer (also `final`), admin (also train, batch,
  delete, logs, models): MONAI Label's own route roles, plus `final` for reviewers (`install_label_route`) and the
  in-process batch for admins (`batch_routes`).
- `ROUTE_ROLES` makes model uploads and deletes admin-only (MONAI Label checks annotator there).
- `/health/*`, the OpenAPI page and OHIF's static files are open; everything else needs a token.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
from pathlib import Path
from typing import Optional

from fastapi import BackgroundTasks, Depends, FastAPI, File, Form, HTTPException, UploadFile, status
from fastapi.security import OAuth2PasswordBearer, OAuth2PasswordRequestForm
from jwt import InvalidTokenError
from monailabel.config import settings
from monailabel.endpoints import datastore as ml_datastore
from monailabel.endpoints.user.auth import DEFAULT_USER, RBAC, User, get_current_user
from monailabel.interfaces.datastore import DefaultLabelTag
from starlette.concurrency import run_in_threadpool

from rocm_zoo.server.auth import tokens
from rocm_zoo.server.auth.users import ROLES, UserFile, monailabel_roles
from rocm_zoo.server.upload_routes import cleanup_now

logger = logging.getLogger(__name__)

MONAILABEL_DEFAULT_HOST = "0.0.0.0"  # `monailabel start_server` without --host
OPEN_PREFIXES = ("/ohif",)  # static viewer files: no data; the viewer then calls the API with the token


def bind_host(argv: list[str] | None = None) -> str:
    """The host `monailabel start_server` was given (`--host H`, `--host=H`, `-i H`), else its default 0.0.0.0."""
    argv = list(sys.argv if argv is None else argv)
    for i, arg in enumerate(argv):
        if arg in ("--host", "-i") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return MONAILABEL_DEFAULT_HOST


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def decide(conf_auth: str, host: str, keycloak: bool) -> str:
    """keycloak, local or off."""
    if keycloak:
        return "keycloak"
    if conf_auth == "on" or (conf_auth == "auto" and not is_loopback(host)):
        return "local"
    return "off"


def users_path(conf_users_file: str, app_dir: str | Path) -> Path:
    return Path(conf_users_file) if conf_users_file else Path(app_dir) / "users.json"


def _role_names() -> dict[str, str]:
    s = settings
    return {"user": s.MONAI_LABEL_AUTH_ROLE_USER, "annotator": s.MONAI_LABEL_AUTH_ROLE_ANNOTATOR,
            "reviewer": s.MONAI_LABEL_AUTH_ROLE_REVIEWER, "admin": s.MONAI_LABEL_AUTH_ROLE_ADMIN}


def _routes(routes):
    """Every route, through the routers FastAPI keeps nested (include_router no longer copies routes up)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes)
        else:
            yield route


def _rbac_of(route) -> list:
    return [d.call for d in getattr(getattr(route, "dependant", None), "dependencies", []) if isinstance(d.call, RBAC)]


# Where MONAI Label 0.8.5's RBAC is looser than its own route summaries say ("|RBAC: admin|" on routes that check
# annotator): uploading and deleting a model's weights.
ROUTE_ROLES = {("PUT", "/model/{model}"): "admin", ("DELETE", "/model/{model}"): "admin"}


def open_static_routes(web: FastAPI) -> None:
    """OHIF's static files without a token, and ROUTE_ROLES, through dependency overrides (MONAI Label's route
    objects stay as they are)."""
    names = _role_names()
    for route in _routes(web.router.routes):
        for method in getattr(route, "methods", None) or ():
            role = ROUTE_ROLES.get((method, getattr(route, "path", "")))
            for rbac in _rbac_of(route) if role else ():
                web.dependency_overrides[rbac] = RBAC(names[role])
        if str(getattr(route, "path", "")).startswith(OPEN_PREFIXES):
            for rbac in _rbac_of(route):
                web.dependency_overrides[rbac] = _anyone


async def _anyone() -> User:
    return DEFAULT_USER


class LocalAuth:
    """Tokens for the users of the local user file."""

    def __init__(self, users: UserFile, secret: bytes, token_hours: float):
        self.users = users
        self.secret = secret
        self.token_hours = token_hours

    def login(self, username: str, password: str) -> dict:
        user = self.users.check(username, password)
        if user is None:
            raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Wrong user name or password",
                                headers={"WWW-Authenticate": "Bearer"})
        token = tokens.issue(self.secret, user.name, monailabel_roles(user.role), self.token_hours)
        logger.info("auth: %s (%s) logged in", user.name, user.role)
        return {"access_token": token, "token_type": "bearer"}

    def user_of(self, token: Optional[str]) -> User:
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
        # The role is the user file's now, not the token's: a changed role counts at once.
        return User(username=local.name, name=local.name, roles=monailabel_roles(local.role))


def install(web: FastAPI, config, app_dir: str | Path) -> str:
    """Sets up auth for this server; returns the mode (keycloak, local, off) after logging it."""
    host = bind_host()
    mode = decide(config.auth, host, keycloak=bool(settings.MONAI_LABEL_AUTH_ENABLE))
    if mode == "keycloak":
        logger.warning("rocm_zoo auth: ON, MONAI Label's Keycloak flow (realm %s)", settings.MONAI_LABEL_AUTH_REALM_URI)
        open_static_routes(web)
        return mode
    _install_routes(web, None)
    if mode == "off":
        why = "--conf auth off" if config.auth == "off" else f"listening on loopback ({host})"
        log = logger.warning if not is_loopback(host) else logger.info
        log("rocm_zoo auth: OFF (%s): every request is allowed%s", why,
            "" if is_loopback(host) else "; ANYONE ON THE NETWORK CAN USE AND CHANGE THE DATASTORE")
        return mode
    path = users_path(config.users_file, app_dir)
    users = UserFile(path)
    local = LocalAuth(users, tokens.load_secret(path.with_name(path.name + ".secret")), config.token_hours)
    _install_routes(web, local)
    settings.MONAI_LABEL_AUTH_ENABLE = True  # RBAC reads it at each request

    bearer = OAuth2PasswordBearer(tokenUrl="/auth/token", auto_error=False)

    async def current_user(token: Optional[str] = Depends(bearer)) -> User:
        return local.user_of(token)

    web.dependency_overrides[get_current_user] = current_user
    open_static_routes(web)
    _document_bearer(web)
    count = len(users.list())
    why = "--conf auth on" if config.auth == "on" else f"listening beyond loopback ({host})"
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
        def access_token(form_data: OAuth2PasswordRequestForm = Depends()):  # scrypt: in a worker thread
            return local.login(form_data.username, form_data.password)

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


def install_label_route(web: FastAPI) -> None:
    """`PUT /datastore/label` as MONAI Label's, except that a `final` label (the default tag) needs the reviewer
    role, and the save (checks, SEG encoding, PACS) runs in a worker thread, not on the event loop."""
    names = _role_names()
    before = len(web.router.routes)

    @web.put("/datastore/label", summary="Save a label (tag final, the default, needs the reviewer role)",
             tags=["Datastore"])
    async def api_save_label(background_tasks: BackgroundTasks, image: str, params: str = Form("{}"),
                             tag: str = DefaultLabelTag.FINAL.value, label: UploadFile = File(...),
                             user: User = Depends(RBAC(names["annotator"]))):
        if (tag or DefaultLabelTag.FINAL.value) == DefaultLabelTag.FINAL.value and settings.MONAI_LABEL_AUTH_ENABLE \
                and not {names["reviewer"], names["admin"]} & set(user.roles):
            raise HTTPException(status_code=status.HTTP_403_FORBIDDEN,
                                detail="Saving a 'final' label needs the reviewer role; save under another tag")
        try:
            return await run_in_threadpool(ml_datastore.save_label, background_tasks, image, params, tag, label,
                                           user.username)
        except BaseException:  # a refused label: MONAI Label removes its temporary file after a success only
            cleanup_now(background_tasks)
            raise

    _put_first(web, before)


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
    logger.info("rocm_zoo: CORS origins allowed: %s", ", ".join(origins) if origins else "none (same origin only)")
