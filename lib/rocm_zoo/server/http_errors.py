"""Clear 4xx answers for bad requests, with the reason, instead of MONAI Label's bare 500.

MONAI Label registers no exception handlers; these are added to its FastAPI app once the app instance exists.
No answer names a server path (they are reduced to file names) or carries a stack trace: an unexpected error is a
500 that says so, and the trace goes to the server's log only.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from monailabel.interfaces.exception import (ImageNotFoundException, LabelNotFoundException, MONAILabelError,
                                             MONAILabelException)

from rocm_zoo.errors import RocmZooError
from rocm_zoo.server.access import redact

logger = logging.getLogger(__name__)


def _answer(status: int, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": redact(detail)}, headers=headers)


async def _rocm_zoo_error(request: Request, exc: RocmZooError) -> JSONResponse:
    logger.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    return _answer(exc.status, str(exc), getattr(exc, "headers", None))


async def _bad_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
    return _answer(422, f"'params' is not valid JSON: {exc}")


async def _monailabel_error(request: Request, exc: MONAILabelException) -> JSONResponse:
    if isinstance(exc, (ImageNotFoundException, LabelNotFoundException)):
        return _answer(404, exc.msg)
    return _answer(422 if exc.error == MONAILabelError.INVALID_INPUT else 500, exc.msg)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("%s %s -> 500", request.method, request.url.path, exc_info=exc)
    return _answer(500, f"Internal error ({type(exc).__name__}); the server log has the details")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RocmZooError, _rocm_zoo_error)
    app.add_exception_handler(json.JSONDecodeError, _bad_json)
    app.add_exception_handler(MONAILabelException, _monailabel_error)
    app.add_exception_handler(Exception, _unexpected)
    # Starlette copies the handlers into its middleware stack when the first request (the lifespan) arrives, which
    # is before the app instance exists; dropping the stack makes the next request build it again with them.
    app.middleware_stack = None
