"""`GET /logs/gpu` as MONAI Label's (admins: the output of the GPU's own tool), except that it also knows ROCm and
says so when the server has neither tool: MONAI Label runs `nvidia-smi` unconditionally, and on a CPU or ROCm server
the missing program was a 500."""

from __future__ import annotations

import shutil
import subprocess

from fastapi import Depends, FastAPI
from fastapi.responses import Response
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User

from rocm_zoo.errors import NotOnThisServer

TOOLS = ("nvidia-smi", "rocm-smi")
TIMEOUT_S = 20


def install(web: FastAPI) -> None:
    before = len(web.router.routes)

    @web.get("/logs/gpu", summary="The GPU's own report (nvidia-smi or rocm-smi)", tags=["Others"])
    def gpu_info(user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> Response:
        tool = next((t for t in TOOLS if shutil.which(t)), None)
        if tool is None:
            raise NotOnThisServer(f"This server has no {' or '.join(TOOLS)}: no GPU driver to ask; "
                                  "/info/ -> rocm_zoo.backend describes the device it uses")
        run = subprocess.run([tool], capture_output=True, text=True, timeout=TIMEOUT_S)
        return Response(content=run.stdout or run.stderr, media_type="text/plain")

    ours = web.router.routes[before:]  # ahead of MONAI Label's (FastAPI takes the first route that matches)
    del web.router.routes[before:]
    web.router.routes[0:0] = ours
