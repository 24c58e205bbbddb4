"""Clear 4xx answers for bad requests, with the reason, instead of MONAI Label's bare 500.

MONAI Label registers no exception handlers; these are added to its FastAPI app once the app instance exists.
No answer names a server path (they are reduced to file names) or carries a stack trace: an unexpected error is a
500 that says so, and the trace goes to the server's log only.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from monailabel.interfaces.exception import (ImageNotFoundException, LabelNotFoundException, MONAILabelError,
                                             MONAILabelException)
from pydantic import ValidationError

from rocm_zoo.errors import RocmZooError
from rocm_zoo.server.http.access import redact
from rocm_zoo.server.http.request_queue import ClientGone

logger = logging.getLogger(__name__)


def _answer(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": redact(detail)}, headers=headers)


async def _rocm_zoo_error(request: Request, exc: RocmZooError) -> JSONResponse:
    logger.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    headers = dict(getattr(exc, "headers", None) or {})
    retry_after = getattr(exc, "retry_after_s", None)  # a full queue says when to come back
    if retry_after:
        headers["Retry-After"] = str(retry_after)
    return _answer(exc.status, str(exc), headers or None)


async def _client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": for the access log, nobody reads it


async def _bad_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
    return _answer(422, f"'params' is not valid JSON: {exc}")


async def _monailabel_error(request: Request, exc: MONAILabelException) -> JSONResponse:
    if isinstance(exc, (ImageNotFoundException, LabelNotFoundException)) or "There is no" in str(exc.msg):
        return _answer(404, exc.msg)  # MONAI Label's "Task is not Initialized. There is no such strategy/model"
    return _answer(422 if exc.error == MONAILabelError.INVALID_INPUT else 500, exc.msg)


# MONAI Label 0.8.5 answers these client mistakes with its own 500s.
_CLIENT_500S = {"Neither Image nor File not Session ID input is provided": 422,
                "DICOM SEG format is not supported in a non-DICOM datastore": 422,
                "Model File Name NOT configured for": 404}


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 500:
        for text, status in _CLIENT_500S.items():
            if str(exc.detail).startswith(text):
                return _answer(status, str(exc.detail))
    return await http_exception_handler(request, exc)


def _raised_at(exc: BaseException) -> str:
    """The file of the innermost Python frame the error was raised in."""
    tb = exc.__traceback__
    last = ""
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last


def _raised_in(exc: BaseException, *places: str) -> bool:
    """Whether the innermost frame is in one of `places` (package folders such as "monailabel/endpoints/", or files)."""
    where = _raised_at(exc).replace(os.sep, "/")
    return any(f"/{place}" in where for place in places)


def _client_error(exc: Exception) -> tuple[int, str] | None:
    """The status and reason of an exception that is the request's fault, else None (a server fault: 500). Only
    errors raised where MONAI Label reads the request count: the same exception type raised deeper (a model, a
    bundle, our own code) is the server's, and a fuzzer must see it as a 500."""
    if isinstance(exc, (TypeError, ValueError, AttributeError, KeyError, OverflowError)) and \
            _raised_in(exc, "monailabel/endpoints/"):  # e.g. `params` that is JSON but not an object
        return 422, (f"The request's parameters do not have the form this route takes ({type(exc).__name__}: "
                     f"{str(exc)[:200]})")
    if isinstance(exc, ValidationError) and _raised_in(exc, "pydantic/"):  # a route's model_validate of the body
        return 422, f"The request body does not have the form this route takes: {str(exc).splitlines()[0]}"
    if isinstance(exc, AssertionError) and _raised_in(exc, "monailabel/endpoints/", "monailabel/datastore/"):
        return 422, str(exc) or "The request cannot be served as given"  # e.g. a dataset zip of an empty datastore
    if isinstance(exc, shutil.ReadError):  # only unpacking an uploaded archive raises it
        return 422, f"The upload is not an archive this route can unpack: {exc}"
    if (isinstance(exc, FileNotFoundError) or (isinstance(exc, RuntimeError) and "is not a file" in str(exc))) and \
            _raised_in(exc, "monailabel/endpoints/", "monailabel/datastore/", "monailabel/utils/sessions.py",
                       "starlette/responses.py"):  # a file the request named (an image, a label, a session's)
        return 404, f"Not found: {exc}"
    return None


def _disk_full(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT: a write the server could not finish; the atomic writes left what was stored before intact."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    if _disk_full(exc):
        logger.error("%s %s -> 507: %s", request.method, request.url.path, exc)
        return _answer(507, f"The server's disk is full ({os.strerror(exc.errno)}); nothing was stored and what was "
                            "stored before is intact. Retry once space is freed.")
    mapped = _client_error(exc)
    if mapped is not None:
        logger.warning("%s %s -> %d: %s raised at %s: %s", request.method, request.url.path, mapped[0],
                       type(exc).__name__, os.path.basename(_raised_at(exc)), redact(str(exc))[:200])
        return _answer(*mapped)
    logger.error("%s %s -> 500", request.method, request.url.path, exc_info=exc)
    return _answer(500, f"Internal error ({type(exc).__name__}); the server log has the details")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RocmZooError, _rocm_zoo_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(json.JSONDecodeError, _bad_json)
    app.add_exception_handler(MONAILabelException, _monailabel_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    # Starlette copies the handlers into its middleware stack when the first request (the lifespan) arrives, which
    # is before the app instance exists; dropping the stack makes the next request build it again with them.
    app.middleware_stack = None
