"""Clear 4xx answers for bad requests, with the reason, instead of MONAI Label's bare 500.

MONAI Label registers no exception handlers; these are added to its FastAPI app once the app instance exists.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from monailabel.interfaces.exception import MONAILabelError, MONAILabelException

from rocm_zoo.errors import RocmZooError
from rocm_zoo.server.request_queue import ClientGone

logger = logging.getLogger(__name__)


def _answer(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


async def _rocm_zoo_error(request: Request, exc: RocmZooError) -> JSONResponse:
    logger.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    retry_after = getattr(exc, "retry_after_s", None)  # a full queue says when to come back
    return _answer(exc.status, str(exc), {"Retry-After": str(retry_after)} if retry_after else None)


async def _client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": for the access log, nobody reads it


async def _bad_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
    return _answer(422, f"'params' is not valid JSON: {exc}")


async def _monailabel_error(request: Request, exc: MONAILabelException) -> JSONResponse:
    return _answer(422 if exc.error == MONAILabelError.INVALID_INPUT else 500, exc.msg)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RocmZooError, _rocm_zoo_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(json.JSONDecodeError, _bad_json)
    app.add_exception_handler(MONAILabelException, _monailabel_error)
    # Starlette copies the handlers into its middleware stack when the first request (the lifespan) arrives, which
    # is before the app instance exists; dropping the stack makes the next request build it again with them.
    app.middleware_stack = None
