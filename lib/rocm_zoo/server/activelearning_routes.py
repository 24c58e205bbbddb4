"""`POST /activelearning/{strategy}` in a worker thread, ahead of MONAI Label's own.

MONAI Label's handler is `async def` and calls the strategy directly: the uncertainty strategy runs the network over
studies for seconds to minutes, and on the event loop nothing else would be answered meanwhile (not even a click's
request). Same path, JSON body and answer as MONAI Label's (it is its `sample` function that runs), so Slicer, OHIF and
MONAILabelClient need no change. (routes.run_blocking_handlers_in_threads does not reach it: FastAPI >= 0.16x keeps
included routers as `_IncludedRouter` entries, not their routes.)
"""

from __future__ import annotations

from typing import Optional

from fastapi import Body, Depends, FastAPI
from monailabel.config import settings
from monailabel.endpoints.activelearning import sample
from monailabel.endpoints.user.auth import RBAC, User


def install(app: FastAPI) -> None:
    before = len(app.router.routes)

    @app.post("/activelearning/{strategy}", tags=["ActiveLearning"],
              summary="Next sample to annotate by this strategy (in a worker thread)")
    def api_sample(strategy: str, params: Optional[dict] = Body(None),
                   user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER))) -> dict:
        return sample(strategy, params, user.username)

    ours = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = ours
