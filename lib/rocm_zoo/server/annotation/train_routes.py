"""`/train` answered by the server's own trainings instead of MONAI Label's subprocess (which rebuilds the whole app
and reports no progress).

Same paths and parameters as MONAI Label's: Slicer's Train posts `/train/{model}` (options as the JSON body), OHIF's
"Update Model" posts `/train/` (here: only the models whose final labels changed since their last training), `GET
/train/` gives the running training's record, else the latest one (`all=true`: every one since start-up;
`check_if_running=true`: 404 when none runs), `DELETE /train/` stops. A second train request while one runs gets 429
with the reason, as MONAI Label's. Progress is in each record and in `/info` -> `train_stats`, where both viewers read
it.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import Body, Depends, FastAPI, HTTPException
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User

from rocm_zoo.server.annotation.trainers import Training


def install(app: FastAPI, training: Training) -> None:
    before = len(app.router.routes)
    service = training.service

    @app.get("/train/", summary="The latest training (all=true: every one; check_if_running=true: 404 when none runs)")
    def status(all: bool = False, check_if_running: bool = False,
               user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER))) -> Any:
        if check_if_running:
            running = service.running()
            if running is None:
                raise HTTPException(status_code=404, detail="No training is running")
            return running
        records = service.records()
        if not records:
            raise HTTPException(status_code=404, detail="No training has run since the server started")
        return records if all else service.running() or records[-1]

    @app.post("/train/", summary="Train every model whose final labels changed since its last training")
    def run_all(params: Optional[dict] = Body(None), run_sync: bool = False,
                user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> dict[str, Any]:
        return _started(training.start(None, params), run_sync)

    @app.post("/train/{model}", summary="Train one model on the final labels (options: max_epochs, val_split, "
              "pretrained)")
    def run_model(model: str, params: Optional[dict] = Body(None), run_sync: bool = False, enqueue: bool = False,
                  user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> dict[str, Any]:
        return _started(training.start([model], {model: params or {}, **(params or {})}, enqueue), run_sync)

    @app.delete("/train/", summary="Stop the running training (the served weights stay) and drop queued ones")
    def stop(user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ADMIN))) -> list[dict[str, Any]]:
        return service.stop()

    def _started(answer: dict[str, Any], run_sync: bool) -> dict[str, Any]:
        if run_sync:
            service.wait()
            finished = {r["id"]: r for r in service.records()}
            answer["started"] = [finished.get(r["id"], r) for r in answer["started"]]
        return answer

    ours = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = ours
