"""`/batch/infer` answered by the in-process BatchRunner instead of MONAI Label's subprocess.

Same paths, query parameters and JSON body as MONAI Label's endpoint (`POST /batch/infer/{model}?images=all|labeled|
unlabeled&run_sync=false` with `params` as the body; `GET` for status; `DELETE` to stop), so Slicer, OHIF and scripts
need no change. Extra body keys: `label_tag` (default `original`; `final` is refused) and `image_ids` (a list, instead
of a selection). The routes are put ahead of MONAI Label's, which FastAPI would otherwise match first.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from fastapi import Body, Depends, FastAPI
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User

from rocm_zoo.errors import ModelNotFound
from rocm_zoo.server.batch.runs import BatchRunner

# MONAI Label's own defaults for this endpoint's body: meant for its subprocess, meaningless here.
_SUBPROCESS_KEYS = ("device", "multi_gpu", "gpus", "logging", "max_workers", "max_batch_size", "save_label")


def install(app: FastAPI, runner: BatchRunner, models: Callable[[], list[str]]) -> None:
    before = len(app.router.routes)

    @app.post("/batch/infer/{model}", summary="Run batch inference in the server process (warm models)")
    def run(model: str, images: str = "all", run_sync: bool = False, params: Optional[dict] = Body(None),
            user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> dict[str, Any]:
        if model not in models():
            raise ModelNotFound(f"There is no model '{model}'. Known models: {', '.join(models())}")
        params = {k: v for k, v in (params or {}).items() if k not in _SUBPROCESS_KEYS}
        tag = params.pop("label_tag", "original")
        image_ids = params.pop("image_ids", None)
        batch = runner.start(model, images, tag, params, image_ids)
        if run_sync:
            runner.wait()
        return batch.progress()

    @app.get("/batch/infer", summary="Progress of the current batch (all=true: every batch since start-up)")
    def status(all: bool = False, user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER))) -> Any:
        if all:
            return [b.progress() for b in runner.history]
        return runner.current.progress() if runner.current else {}

    @app.delete("/batch/infer", summary="Stop the current batch after the study it is on")
    def stop(user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> dict[str, Any]:
        batch = runner.stop()
        return batch.progress() if batch else {}

    ours = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = ours
