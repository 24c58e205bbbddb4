"""MONAI Label's HTTP API, served so that the event loop never computes; plus health endpoints for orchestrators.

MONAI Label 0.8.5 declares its handlers `async def` and calls blocking work from them (`/infer` runs the whole
inference on the event loop), so while one request computes nothing else is answered, not even `/info`. Here:
- `/infer/{model}` is replaced by a handler with the same parameters that hands the work to `RequestService`: a
  worker thread, the class's bounded queue, a deadline, dropped when the client hangs up;
- every other MONAI Label handler that is a coroutine but only calls blocking code runs in a worker thread (FastAPI's
  pool) instead, with its parameters, dependencies (auth) and OpenAPI entry unchanged;
- `/health/live` and `/health/ready` (KServe v2 / Triton style) say whether the process is up and whether every
  interactive model is warm;
- MONAI Label's routes in `SWITCHED_OFF` are removed (404, and gone from the OpenAPI schema): every route that runs a
  model goes through `RequestService` (or the batch and training runners, at the scheduler's lower classes), and
  `/proxy/dicom/*` is `rocm_zoo.dicomweb.proxy`'s.
Clients (Slicer, OHIF, MONAILabelClient) see the same API.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from typing import Any, Callable, Optional

from fastapi import BackgroundTasks, Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from monailabel.config import settings
from monailabel.endpoints.infer import ResultType, run_inference
from monailabel.endpoints.user.auth import RBAC, User
from starlette.concurrency import run_in_threadpool

from rocm_zoo.engine.scheduler import Priority
from rocm_zoo.errors import DeadlineExceeded, InvalidRequest, QueueFull
from rocm_zoo.server.audit.routes import actor_of
from rocm_zoo.server.http.request_queue import ClientGone, RequestService
from rocm_zoo.server.store.upload_routes import cleanup_now

# MONAI Label handlers that really await I/O stay on the event loop: none left (its DICOMweb proxy, which blocked the
# loop, is replaced).
TRULY_ASYNC_MODULES: tuple[str, ...] = ()
ALL_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
# Active-learning calls at once: `uncertainty` runs a model (at the scheduler's batch class, a bounded number of studies
# per call, one ranking at a time); more waiting callers would each hold a worker thread of FastAPI's pool, which every
# threaded route shares, so one more gets a 503 with Retry-After instead.
BOUNDED_MODULES = {"monailabel.endpoints.activelearning": 4}
BOUNDED_RETRY_S = 5
# MONAI Label's routes that this server does not serve: (handler module, methods) -> why.
SWITCHED_OFF = {
    ("monailabel.endpoints.wsi_infer", ALL_METHODS):
        "WSI inference: no WSI model is served; it ran any model outside the request queues (no bound, no deadline) "
        "and told a client which server files exist",
    ("monailabel.endpoints.scoring", frozenset({"POST"})):
        "scoring: no scoring method is served; each call started the app again in a subprocess",
    ("monailabel.endpoints.proxy", ALL_METHODS):
        "DICOMweb proxy: replaced by rocm_zoo.dicomweb.proxy (timeouts, off the event loop)",
    ("monailabel.endpoints.model", frozenset({"PUT", "DELETE"})):
        "model upload and delete: the upload copied any bytes over the served weights file (not atomic, not checked "
        "against the network, not kept for rollback) and the delete left the model without weights; weights change "
        "through trainings and `rocm-zoo models rollback` (rocm_zoo.training.checkpoints)",
}
INTERACTIVE_TYPES = ("deepedit", "deepgrow", "vista3d")


def install(web: FastAPI, service: RequestService, task_type: Callable[[str], str],
            readiness: Callable[[], tuple[bool, dict[str, Any]]],
            on_inferred: Optional[Callable[[dict[str, Any], str, str], None]] = None) -> None:
    """`on_inferred(actor, image, model)` after each answered inference (a label's provenance)."""
    switch_off(web.router)
    web.openapi_schema = None  # the schema is built again from the routes as served (one made earlier is stale)
    run_blocking_handlers_in_threads(web)
    _put_first(web, lambda: _install_infer(web, service, task_type, on_inferred))
    _put_first(web, lambda: _install_health(web, readiness))


def _put_first(web: FastAPI, add: Callable[[], None]) -> None:
    """Routes added by `add`, ahead of MONAI Label's (Starlette takes the first route that matches)."""
    before = len(web.router.routes)
    add()
    ours = web.router.routes[before:]
    del web.router.routes[before:]
    web.router.routes[0:0] = ours


def switch_off(router) -> list[str]:
    """Removes, from `router` and every router included in it, MONAI Label's routes in SWITCHED_OFF (a route keeps the
    methods not switched off). Returns "METHOD path" of each removed."""
    removed: list[str] = []
    kept = []
    for route in router.routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            removed += switch_off(included)
            kept.append(route)
            continue
        module = getattr(getattr(route, "endpoint", None), "__module__", "")
        methods = set(getattr(route, "methods", None) or ())
        off = set().union(*(m for (mod, m) in SWITCHED_OFF if mod == module)) & methods if methods else set()
        if not off:
            kept.append(route)
            continue
        removed += [f"{m} {route.path}" for m in sorted(off)]
        if methods - off:
            route.methods = methods - off
            kept.append(route)
    if removed:
        router.routes[:] = kept
        if hasattr(router, "_mark_routes_changed"):  # an included router's resolved routes are cached
            router._mark_routes_changed()
    return removed


def run_blocking_handlers_in_threads(web: FastAPI) -> None:
    _handlers_in_threads(web.router)


def _handlers_in_threads(router) -> None:
    """Replaces, in `router` and every router included in it, each MONAI Label coroutine handler by a thread one.
    FastAPI (0.16x) keeps an included router as one entry that resolves the router's own routes when first matched,
    so the replacement happens in the included router itself."""
    changed = False
    for i, route in enumerate(router.routes):
        included = getattr(route, "original_router", None)
        if included is not None:
            _handlers_in_threads(included)
            continue
        if not isinstance(route, APIRoute) or not inspect.iscoroutinefunction(route.endpoint):
            continue
        module = getattr(route.endpoint, "__module__", "")
        if not module.startswith("monailabel.endpoints") or module in TRULY_ASYNC_MODULES:
            continue
        handler = _in_thread(route.endpoint)
        if module in BOUNDED_MODULES:
            handler = bounded(handler, BOUNDED_MODULES[module], route.path)
        router.routes[i] = APIRoute(
            route.path, handler, methods=route.methods, name=route.name, summary=route.summary,
            description=route.description, tags=route.tags, dependencies=route.dependencies,
            responses=route.responses, response_class=route.response_class, status_code=route.status_code,
            include_in_schema=route.include_in_schema, deprecated=route.deprecated,
            operation_id=route.operation_id, response_model=route.response_model,
        )
        changed = True
    if changed and hasattr(router, "_mark_routes_changed"):  # an included router's resolved routes are cached
        router._mark_routes_changed()


def _in_thread(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function with `endpoint`'s signature, which FastAPI runs in its thread pool. (Not functools.wraps:
    FastAPI follows `__wrapped__` and would await it again.)"""

    def handler(**kwargs: Any) -> Any:
        try:
            return asyncio.run(endpoint(**kwargs))
        except BaseException:  # a refused upload: its temporary file was queued for removal after a success only
            cleanup_now(kwargs.get("background_tasks"))
            raise

    handler.__signature__ = inspect.signature(endpoint)
    handler.__name__ = endpoint.__name__
    handler.__doc__ = endpoint.__doc__
    handler.__module__ = endpoint.__module__
    return handler


def bounded(handler: Callable[..., Any], at_once: int, what: str) -> Callable[..., Any]:
    """`handler` (a plain function, run in a worker thread), refused with QueueFull while `at_once` calls run."""
    slots = threading.BoundedSemaphore(at_once)

    def limited(**kwargs: Any) -> Any:
        if not slots.acquire(blocking=False):
            raise QueueFull(f"{what}: {at_once} calls are running; try again in {BOUNDED_RETRY_S} s",
                            retry_after_s=BOUNDED_RETRY_S)
        try:
            return handler(**kwargs)
        finally:
            slots.release()

    for attr in ("__signature__", "__name__", "__doc__", "__module__"):
        if hasattr(handler, attr):
            setattr(limited, attr, getattr(handler, attr))
    return limited


def request_priority(task_type: Optional[str]) -> Priority:
    """Clicks (DeepEdit, VISTA3D, either viewer) before automatic requests."""
    return Priority.INTERACTIVE if task_type in INTERACTIVE_TYPES else Priority.AUTOMATIC


def client_of(request: Request, params: dict, session_id: str) -> str:
    """Whose request this is, for round robin: Slicer sends `client_id`; else the session; else the client's address."""
    client = params.get("client_id") or session_id
    if client:
        return str(client)
    return request.client.host if request.client else "unknown"


def _install_infer(web: FastAPI, service: RequestService, task_type: Callable[[str], str],
                   on_inferred: Optional[Callable[[dict[str, Any], str, str], None]]) -> None:
    """`task_type(model)` raises ModelNotFound for a model the server does not serve: refused at once, not queued."""
    @web.post("/infer/{model}", tags=["Infer"], summary="Run inference (queued by class, round robin between clients)")
    async def api_run_inference(
        request: Request,
        background_tasks: BackgroundTasks,
        model: str,
        image: str = "",
        session_id: str = "",
        params: str = Form("{}"),
        file: UploadFile = File(None),
        label: UploadFile = File(None),
        output: Optional[ResultType] = None,
        user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER)),
    ):
        parsed = json.loads(params) if params else {}
        if not isinstance(parsed, dict):
            raise InvalidRequest(f"'params' must be a JSON object, not {type(parsed).__name__}")
        work = service.work(request_priority(task_type(model)), client_of(request, parsed, session_id), model)

        def remove_files() -> None:  # what the response would have cleaned up after itself
            for task in background_tasks.tasks:
                task.func(*task.args, **task.kwargs)

        try:
            answer = await service.run(request, work, run_inference, background_tasks, model, image, session_id,
                                       params, file, label, output, on_abandon=remove_files)
            if on_inferred is not None:  # off the event loop: it may read the model's checkpoint index
                await run_in_threadpool(on_inferred, actor_of(request.scope), image, model)
            return answer
        except (DeadlineExceeded, ClientGone):
            raise  # the work may still be running: on_abandon removes its files when it ends
        except BaseException:
            cleanup_now(background_tasks)  # refused (e.g. a bad upload): only a success runs background tasks
            raise


def _install_health(web: FastAPI, readiness: Callable[[], tuple[bool, dict[str, Any]]]) -> None:
    @web.get("/health/live", tags=["Health"], summary="The process is up and answering")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @web.get("/health/ready", tags=["Health"], summary="200 once every interactive model is warm, 503 before")
    async def ready() -> JSONResponse:
        ok, detail = readiness()
        return JSONResponse(status_code=200 if ok else 503, content={"status": "ready" if ok else "warming", **detail})
