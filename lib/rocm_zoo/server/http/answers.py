"""Answers that name no server path, success included: datastore ids and names instead.

MONAI Label's JSON answers carry absolute paths of the server: `/datastore/image/info` and `/activelearning/*` the
image's `path` (from `LocalDatastore.get_image_info`), `/datastore/?output=train` every image and label file, the
`/session/` routes the session's folder and image; and a task's or bundle's info may name a file. Each JSON answer of
every route (MONAI Label's and ours) is cleaned where it is made, by wrapping the route's handler once every route
exists (`install`):
- a `path` key holding a server path is dropped: Slicer then downloads the image by id (`/datastore/image?image=`),
  as it does from any remote server, instead of opening a file on its own disk of that name;
- any other string that is a server path becomes its name inside the studies folder (`labels/final/ct_1.nii.gz`),
  or its file name if it is elsewhere; paths inside text are reduced to file names (`access.redact`);
- plain-text answers (`/logs/`) the same way; files, streams and multipart answers (`/infer`'s label) pass as they
  are, and so do the viewer's files (`/ohif/`: HTML, JavaScript, CSS), which are the package's own and which a
  rewrite would break (OHIF's bundles are full of `/`-led strings).
Viewers read ids, names, labels and models from these answers, never a server path.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any, Callable

from fastapi import FastAPI
from fastapi.dependencies.utils import get_typed_signature
from fastapi.encoders import jsonable_encoder
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from starlette.responses import Response

from rocm_zoo.server.http.access import API_ROUTES, redact

DROPPED_KEYS = ("path",)


def is_server_path(value: str) -> bool:
    """An absolute path of this machine (not one of the server's own routes, which answers may name)."""
    if not value.startswith("/") or value.startswith("//") or "\n" in value:
        return False
    parts = value.strip("/").split("/")
    return bool(parts[0]) and not (parts[0] in API_ROUTES and ".." not in parts)


def name_of(path: str, roots: tuple[str, ...]) -> str:
    """A server path as a client may see it: relative to the first root it is inside, else its file name."""
    real = os.path.realpath(path)
    for root in roots:
        root = os.path.realpath(root)
        if real.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(real, root)
    return os.path.basename(path.rstrip("/")) or "<path>"


def clean(value: Any, roots: tuple[str, ...] = ()) -> Any:
    """`value` (decoded JSON) without server paths."""
    if isinstance(value, dict):
        return {k: clean(v, roots) for k, v in value.items()
                if not (k in DROPPED_KEYS and isinstance(v, str) and is_server_path(v))}
    if isinstance(value, list):
        return [clean(v, roots) for v in value]
    if isinstance(value, str):
        if is_server_path(value):
            return name_of(value, roots)
        return clean_text(value, roots) if "/" in value else value
    return value


def clean_text(text: str, roots: tuple[str, ...] = ()) -> str:
    """Text (a message, a log) with the paths in it named as `name_of` names them."""
    for root in roots:
        for form in dict.fromkeys((str(root).rstrip("/"), os.path.realpath(root))):
            if form.startswith("/") and len(form) > 1:
                text = text.replace(form + "/", "")
    return redact(text)


def cleaned_result(result: Any, roots: tuple[str, ...]) -> Any:
    """A handler's result with its JSON cleaned; files, streams and multipart answers are passed as they are."""
    if isinstance(result, JSONResponse):
        data = clean(json.loads(result.body), roots)
        headers = {k: v for k, v in result.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(data, status_code=result.status_code, headers=headers, background=result.background)
    if isinstance(result, FileResponse):  # a server log (`GET /logs/?lines=0`) is text too; images are not
        if not is_plain_text(result):
            return result
        with open(result.path, errors="replace") as f:
            return Response(clean_text(f.read(), roots), media_type=result.media_type, background=result.background)
    if isinstance(result, Response):
        if is_plain_text(result) and isinstance(getattr(result, "body", None), bytes):
            headers = {k: v for k, v in result.headers.items() if k.lower() not in ("content-length", "content-type")}
            return Response(clean_text(result.body.decode(errors="replace"), roots), status_code=result.status_code,
                            headers=headers, media_type=result.media_type, background=result.background)
        return result
    return clean(jsonable_encoder(result), roots)


def is_plain_text(result: Response) -> bool:
    return str(result.media_type or "").split(";")[0].strip() == "text/plain"


def _cleaning(endpoint: Callable[..., Any], roots: Callable[[], tuple[str, ...]]) -> Callable[..., Any]:
    """A handler with `endpoint`'s (resolved) signature and coroutine-ness whose answer is cleaned. (No
    `functools.wraps`: FastAPI follows `__wrapped__` and would call the inner handler.)"""
    if inspect.iscoroutinefunction(endpoint):
        async def handler(**kwargs: Any) -> Any:
            return cleaned_result(await endpoint(**kwargs), roots())
    else:
        def handler(**kwargs: Any) -> Any:
            return cleaned_result(endpoint(**kwargs), roots())

    handler.__signature__ = get_typed_signature(endpoint)
    handler.__name__ = endpoint.__name__
    handler.__doc__ = endpoint.__doc__
    handler.__module__ = endpoint.__module__
    handler.cleans_paths = True
    return handler


def install(web: FastAPI, roots: Callable[[], tuple[str, ...]]) -> None:
    """Every route's JSON answer cleaned (`roots()`: the folders whose files are named relative to them, the studies
    folder first). Called after every route is installed."""
    _wrap_routes(web.router, roots)


def _settings_of(route: APIRoute) -> dict[str, Any]:
    """Everything the route was built with but its path and handler, the dependency overrides' provider (log-in)
    included, so the new route behaves as the old one did."""
    names = list(inspect.signature(APIRoute.__init__).parameters)[3:]
    return {name: getattr(route, name) for name in names if hasattr(route, name)}


def _wrap_routes(router, roots: Callable[[], tuple[str, ...]]) -> None:
    changed = False
    for i, route in enumerate(router.routes):
        included = getattr(route, "original_router", None)  # FastAPI keeps an included router as one entry
        if included is not None:
            _wrap_routes(included, roots)
            continue
        if not isinstance(route, APIRoute) or getattr(route.endpoint, "cleans_paths", False):
            continue
        router.routes[i] = APIRoute(route.path, _cleaning(route.endpoint, roots), **_settings_of(route))
        changed = True
    if changed and hasattr(router, "_mark_routes_changed"):  # an included router's resolved routes are cached
        router._mark_routes_changed()
