"""Who may call what: every route the server answers, with the least of MONAI Label's roles it needs.

MONAI Label's roles, lowest first: user (read the datastore, infer), annotator (save labels), reviewer (`final`
labels and their info), admin (images, models, everyone's work: train, batch, logs). A role holds the ones below
it. Routes keep their `Depends(RBAC(role))`; each RBAC object is replaced (FastAPI dependency overrides) by one
that asks for the role of ROUTE_ROLES, which is tighter than MONAI Label's own in places (uploading images, image
info, downloading model weights, the dataset zip, stopping scoring, a session upload, STOW to the PACS through the
proxy).
`final` labels need the reviewer role, in routes of ours (saving one, and changing its info). The routes that
`rocm_zoo.server.http.routes.SWITCHED_OFF` removes (WSI inference, running scoring, uploading or deleting model weights)
are not in the table.

A route the table does not name keeps MONAI Label's check and is logged at start-up; the tests fail on it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Optional

from fastapi import BackgroundTasks, Depends, FastAPI, File, Form, HTTPException, Request, Security, UploadFile, status
from monailabel.config import settings
from monailabel.endpoints import datastore as ml_datastore
from monailabel.endpoints.user.auth import DEFAULT_USER, RBAC, User, get_current_user
from monailabel.interfaces.datastore import DefaultLabelTag
from starlette.concurrency import run_in_threadpool

from rocm_zoo.errors import InvalidRequest
from rocm_zoo.server.annotation.provenance import KEY as PROVENANCE
from rocm_zoo.server.audit.routes import actor_of
from rocm_zoo.server.store.upload_routes import cleanup_now

logger = logging.getLogger(__name__)

OPEN = "open"
ROLES = ("user", "annotator", "reviewer", "admin")  # MONAI Label's, lowest first
FINAL = DefaultLabelTag.FINAL.value

_DICOM = ("wado", "qido", "stow")
ROUTE_ROLES: dict[tuple[str, str], str] = {
    # no token: the log-in, health probes, the API documentation, OHIF's static files
    ("GET", "/auth/"): OPEN, ("POST", "/auth/token"): OPEN, ("GET", "/health/live"): OPEN,
    ("GET", "/health/ready"): OPEN, ("GET", "/"): OPEN, ("GET", "/docs"): OPEN, ("HEAD", "/docs"): OPEN,
    ("GET", "/openapi.json"): OPEN, ("HEAD", "/openapi.json"): OPEN, ("GET", "/favicon.ico"): OPEN,
    ("GET", "/ohif/{path:path}"): OPEN,
    # reading, and running models on what is read
    ("GET", "/auth/token/valid"): "user", ("GET", "/info/"): "user", ("GET", "/datastore/"): "user",
    ("GET", "/datastore/image"): "user", ("HEAD", "/datastore/image"): "user",
    ("GET", "/datastore/image/info"): "user", ("GET", "/datastore/label"): "user",
    ("HEAD", "/datastore/label"): "user", ("GET", "/datastore/label/info"): "user",
    ("POST", "/infer/{model}"): "user", ("POST", "/activelearning/{strategy}"): "user",
    ("GET", "/batch/infer"): "user", ("GET", "/train/"): "user", ("GET", "/scoring/"): "user",
    ("GET", "/session/{session_id}"): "user", ("DELETE", "/session/{session_id}"): "user",
    **{("GET", f"/proxy/dicom/{op}/{{path:path}}"): "user" for op in _DICOM},
    ("GET", "/proxy/dicom/{path:path}"): "user",
    # annotating: labels (a `final` one needs the reviewer role), and a study of one's own to work on
    ("PUT", "/datastore/label"): "annotator", ("PUT", "/datastore/label/info"): "annotator",
    ("PUT", "/datastore/updatelabelinfo"): "annotator", ("PUT", "/session/"): "annotator",
    # managing images, models and everyone's work
    ("PUT", "/datastore/image"): "admin", ("PUT", "/datastore/"): "admin", ("DELETE", "/datastore/image"): "admin",
    ("DELETE", "/datastore/"): "admin", ("PUT", "/datastore/image/info"): "admin",
    ("DELETE", "/datastore/label"): "admin", ("GET", "/datastore/dataset"): "admin",
    ("GET", "/model/{model}"): "admin", ("GET", "/model/info/{model}"): "admin",
    ("POST", "/batch/infer/{model}"): "admin", ("DELETE", "/batch/infer"): "admin", ("POST", "/train/"): "admin", ("POST", "/train/{model}"): "admin",
    ("DELETE", "/train/"): "admin", ("DELETE", "/scoring/"): "admin", ("GET", "/logs/"): "admin",
    ("GET", "/logs/gpu"): "admin", ("POST", "/reload"): "admin", ("GET", "/audit/"): "admin",
    # writing to the PACS with the server's credentials (STOW-RS through the proxy)
    ("POST", "/proxy/dicom/stow/{path:path}"): "admin",
}
OPEN_MOUNTS = ("/static",)  # MONAI Label's own static files (the API documentation's)


def role_names() -> dict[str, str]:
    s = settings
    return {"user": s.MONAI_LABEL_AUTH_ROLE_USER, "annotator": s.MONAI_LABEL_AUTH_ROLE_ANNOTATOR,
            "reviewer": s.MONAI_LABEL_AUTH_ROLE_REVIEWER, "admin": s.MONAI_LABEL_AUTH_ROLE_ADMIN}


def holders(role: str) -> list[str]:
    """MONAI Label role names that may do what `role` may (it and the ones above it)."""
    names = role_names()
    return [names[r] for r in ROLES[ROLES.index(role):]]


def routes_of(routes):
    """Every route, through the routers FastAPI keeps nested (include_router no longer copies routes up)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from routes_of(inner.routes)
        else:
            yield route


def rbac_of(route) -> list:
    return [d.call for d in getattr(getattr(route, "dependant", None), "dependencies", []) if isinstance(d.call, RBAC)]


def _guarded(dependant) -> bool:
    """Whether a token is asked for: an RBAC or get_current_user anywhere among the route's dependencies."""
    for dep in getattr(dependant, "dependencies", []):
        if isinstance(dep.call, RBAC) or dep.call is get_current_user or _guarded(dep):
            return True
    return False


class RouteRole:
    """In place of one RBAC object, which several routes may share (a handler decorated for GET and POST, or one
    RBAC given to many routes): the role of ROUTE_ROLES for the request's method and matched route; admin for a
    pair the table does not name."""

    def __init__(self, roles: dict[tuple[str, str], str]):
        self.roles = dict(roles)

    async def __call__(self, request: Request, user: User = Security(get_current_user)) -> User:
        route = request.scope.get("route")
        role = self.roles.get((request.method, str(getattr(route, "path", ""))), "admin")
        return await RBAC(holders("user" if role == OPEN else role))(user)


async def anyone() -> User:
    return DEFAULT_USER


def apply_route_roles(web: FastAPI) -> list[str]:
    """Puts ROUTE_ROLES in force; returns the routes it could not decide (not in the table, or open there while
    asking for no token is not possible, or asking for a role while the route checks none), after logging them."""
    by_rbac: dict[RBAC, dict[tuple[str, str], str]] = {}
    undecided = []
    seen: set[tuple[str, str]] = set()
    for route in routes_of(web.router.routes):
        path = str(getattr(route, "path", ""))
        methods = sorted(getattr(route, "methods", None) or ())
        if not methods:
            if path not in OPEN_MOUNTS:
                undecided.append(f"{path} (mounted)")
            continue
        for method in methods:
            if (method, path) in seen:
                continue  # shadowed by a route of ours ahead of it (Starlette takes the first match): never called
            seen.add((method, path))
            role = ROUTE_ROLES.get((method, path))
            if role is None:
                undecided.append(f"{method} {path}")
                continue
            rbacs = rbac_of(route)
            if role != OPEN and not rbacs and not _guarded(getattr(route, "dependant", None)):
                undecided.append(f"{method} {path} (asks for no token)")
            for rbac in rbacs:
                by_rbac.setdefault(rbac, {})[(method, path)] = role
    for rbac, roles in by_rbac.items():
        web.dependency_overrides[rbac] = anyone if set(roles.values()) == {OPEN} else RouteRole(roles)
    if undecided:
        logger.warning("rocm_zoo auth: routes without a role in ROUTE_ROLES (MONAI Label's own check applies): %s",
                       ", ".join(undecided))
    return undecided


def route_table() -> str:
    """ROUTE_ROLES as README's markdown table: one row per path and role, the methods together."""
    rows: dict[tuple[str, str], list[str]] = {}
    for (method, path), role in ROUTE_ROLES.items():
        rows.setdefault((path, role), []).append(method)
    order = {r: i for i, r in enumerate((OPEN,) + ROLES)}
    lines = ["| route | no token | user | annotator | reviewer | admin |", "|---|---|---|---|---|---|"]
    for (path, role), methods in sorted(rows.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        level = order[role]
        cells = ["yes" if level <= i else "" for i in range(len(order))]
        if path in ("/datastore/label", "/datastore/label/info", "/datastore/updatelabelinfo") and role == "annotator":
            cells[order["annotator"]] = "not `final`"
        lines.append(f"| `{'/'.join(sorted(methods))} {path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- routes of ours where a label's tag decides the role ----------------------------------------------------

def _final_needs_reviewer(tag: str | None, user: User, what: str) -> None:
    if (tag or FINAL) == FINAL and settings.MONAI_LABEL_AUTH_ENABLE and \
            not set(holders("reviewer")) & set(user.roles):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN,
                            detail=f"{what} a 'final' label needs the reviewer role; use another tag")


def _info_of(text: str, what: str) -> dict[str, Any]:
    try:
        info = json.loads(text) if text else {}
    except ValueError as e:
        raise InvalidRequest(f"'{what}' must be JSON ({e})") from e
    if not isinstance(info, dict):
        raise InvalidRequest(f"'{what}' must be a JSON object, not {type(info).__name__}")
    return info


def install_label_routes(web: FastAPI, stamp: Optional[Callable[[dict, str, str, dict], dict]] = None) -> None:
    """`PUT /datastore/label` and the label-info routes as MONAI Label's, except that a `final` label (the default
    tag when saving) needs the reviewer role, the work runs in a worker thread, not on the event loop, and a saved
    label's info gets its provenance: `stamp(actor, image, tag, info)` (the info routes cannot change it)."""
    names = role_names()
    before = len(web.router.routes)

    @web.put("/datastore/label", summary="Save a label (tag final, the default, needs the reviewer role)",
             tags=["Datastore"])
    async def api_save_label(request: Request, background_tasks: BackgroundTasks, image: str,
                             params: str = Form("{}"), tag: str = FINAL, label: UploadFile = File(...),
                             user: User = Depends(RBAC(names["annotator"]))):
        _final_needs_reviewer(tag, user, "Saving")
        if stamp is not None:
            params = json.dumps(stamp(actor_of(request.scope), image, tag or FINAL, _info_of(params, "params")))
        try:
            return await run_in_threadpool(ml_datastore.save_label, background_tasks, image, params, tag, label,
                                           user.username)
        except BaseException:  # a refused label: MONAI Label removes its temporary file after a success only
            cleanup_now(background_tasks)
            raise

    @web.put("/datastore/label/info", summary="Update a label's info (of a final label: reviewer role)",
             tags=["Datastore"])
    async def api_put_label_info(label: str, tag: str, info: str = Form("{}"),
                                 user: User = Depends(RBAC(names["annotator"]))):
        _final_needs_reviewer(tag, user, "Changing the info of")
        return await run_in_threadpool(ml_datastore.update_label_info, label, tag, _without_provenance(info, "info"),
                                       user.username)

    @web.put("/datastore/updatelabelinfo", include_in_schema=False, deprecated=True)
    async def api_update_label_info(label: str, tag: str, params: str = Form("{}"),
                                    user: User = Depends(RBAC(names["annotator"]))):
        _final_needs_reviewer(tag, user, "Changing the info of")
        return await run_in_threadpool(ml_datastore.update_label_info, label, tag,
                                       _without_provenance(params, "params"), user.username)

    def _without_provenance(text: str, what: str) -> str:
        return json.dumps({k: v for k, v in _info_of(text, what).items() if k != PROVENANCE})

    ours = web.router.routes[before:]
    del web.router.routes[before:]
    web.router.routes[0:0] = ours
    web.openapi_schema = None
