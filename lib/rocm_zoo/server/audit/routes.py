"""The audit trail over HTTP: every request to a route that changes or takes away the team's data or models is
recorded after its answer (refusals too, with their status), and admins read the trail at `GET /audit/`.

Recorded here, by route: label saves and label info changes, image uploads, changes and deletions, label deletions,
dataset and weight downloads, trainings and batches started or stopped, session uploads, STOW through the proxy, the
app's reload, and reading the trail itself. Log-ins are recorded by the log-in route (`auth`), a finished training
and its weight swap by the trainers, user changes and rollbacks by `rocm-zoo users` and `rocm-zoo models`.

The entry is written in a worker thread after the answer has gone out: a request never waits for the disk's fsync.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import anyio
from fastapi import Depends, FastAPI, HTTPException, Query
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User

from rocm_zoo.server.audit.trail import AuditTrail

logger = logging.getLogger(__name__)

STATE_USER = "rocm_zoo_user"  # request.state key the log-in check fills: (name, local role)

AUDITED: dict[tuple[str, str], str] = {
    ("PUT", "/datastore/label"): "label.saved",
    ("PUT", "/datastore/label/info"): "label.info_changed",
    ("PUT", "/datastore/updatelabelinfo"): "label.info_changed",
    ("DELETE", "/datastore/label"): "label.deleted",
    ("PUT", "/datastore/image"): "image.added",
    ("PUT", "/datastore/"): "image.added",
    ("PUT", "/datastore/image/info"): "image.info_changed",
    ("DELETE", "/datastore/image"): "image.deleted",
    ("DELETE", "/datastore/"): "image.deleted",
    ("GET", "/datastore/dataset"): "dataset.exported",
    ("GET", "/model/{model}"): "weights.downloaded",
    ("POST", "/train/"): "training.started",
    ("POST", "/train/{model}"): "training.started",
    ("DELETE", "/train/"): "training.stopped",
    ("POST", "/batch/infer/{model}"): "batch.started",
    ("DELETE", "/batch/infer"): "batch.stopped",
    ("PUT", "/session/"): "session.uploaded",
    ("POST", "/proxy/dicom/stow/{path:path}"): "pacs.stored",
    ("POST", "/reload"): "app.reloaded",
    ("GET", "/audit/"): "audit.read",
}
DETAIL_KEYS = ("image", "id", "label", "tag", "model", "images")


def actor_of(scope: dict[str, Any]) -> dict[str, Any]:
    """Who sent the request: the logged-in user (name and role) where log-in is on, the address, and the client as
    it names itself (3D Slicer, a browser running OHIF, a script)."""
    client = scope.get("client") or ("?", 0)
    user = (scope.get("state") or {}).get(STATE_USER)
    agent = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == b"user-agent"), "")
    actor: dict[str, Any] = {"user": user[0] if user else None, "role": user[1] if user else None,
                             "address": client[0], "client": agent[:120]}
    if not user and not settings.MONAI_LABEL_AUTH_ENABLE:
        actor["user"] = "(log-in off)"
    return actor


class AuditRequests:
    """ASGI middleware: one trail entry per request to an AUDITED route, after its answer."""

    def __init__(self, app, trail: AuditTrail):
        self.app = app
        self.trail = trail

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        answered: dict[str, int] = {}

        async def send_noting_status(message):
            if message["type"] == "http.response.start":
                answered["status"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            route = scope.get("route")
            event = AUDITED.get((scope.get("method", ""), str(getattr(route, "path", ""))))
            if event is not None:
                await anyio.to_thread.run_sync(self._record, event, scope, answered.get("status", 500))

    def _record(self, event: str, scope: dict[str, Any], status: int) -> None:
        query = _query(scope)
        details = {k: query[k] for k in DETAIL_KEYS if k in query}
        model = (scope.get("path_params") or {}).get("model")
        if model:
            details["model"] = model
        details["status"] = status
        if status >= 400:
            details["refused"] = True
        try:
            self.trail.record(event, actor_of(scope), **details)
        except OSError as e:  # a full disk must not turn a done request into an error; the server log says it
            logger.error("audit: could not record %s (%s): %s", event, details, e)


def _query(scope: dict[str, Any]) -> dict[str, str]:
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    return {k: v[:200] for k, v in parse_qsl(raw, keep_blank_values=True)}


def install(web: FastAPI, trail: AuditTrail) -> None:
    """The middleware (outermost: a request the host check refuses matched no route and is not recorded) and
    `GET /audit/`, admins only."""
    from starlette.middleware import Middleware

    web.user_middleware.insert(0, Middleware(AuditRequests, trail=trail))
    web.middleware_stack = None
    before = len(web.router.routes)

    @web.get("/audit/", summary="The audit trail: who did what, with a check of its hash chain (admins)",
             tags=["Audit"])
    def read_audit(user_name: Optional[str] = Query(None, alias="user", description="only this user's entries"),
                   image: Optional[str] = Query(None, description="only entries naming this image id"),
                   since: Optional[str] = Query(None, description="ISO date or time (UTC), e.g. 2026-12-07"),
                   event: Optional[str] = Query(None, description="only events starting with this, e.g. label"),
                   limit: int = Query(1000, ge=1, le=100_000, description="the last LIMIT entries that match"),
                   _: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))):
        if since is not None and not since[:4].isdigit():
            raise HTTPException(status_code=422, detail=f"since takes an ISO date or time, e.g. 2026-12-07 (not "
                                f"{since[:40]!r})")
        matched = list(trail.entries(user=user_name, image=image, since=since, event=event))
        return {"verify": trail.verify().as_json(), "matched": len(matched), "entries": matched[-limit:]}

    ours = web.router.routes[before:]
    del web.router.routes[before:]
    web.router.routes[0:0] = ours
    web.openapi_schema = None
