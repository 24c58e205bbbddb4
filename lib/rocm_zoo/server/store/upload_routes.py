"""MONAI Label's routes that take an archive or leave a file in the temporary folder, replaced (same paths,
parameters and roles, ahead of MONAI Label's, so its clients still work):

- `PUT /session/` (`uncompress=true` unpacks the upload): MONAI Label unpacks with `shutil.unpack_archive`, which
  writes a member named `../../x` or `/x` there; here the archive goes through `archives.extract` (regular files
  inside the session's folder only, member and size caps) and every volume in the upload is checked header first
  (`volume_check.check_volume`; DICOM images: rows x columns x frames against the same budget). A refused upload
  leaves nothing behind. The answer names no server path.
- `GET /datastore/dataset`: MONAI Label leaves every zip it sends in the temporary folder; here it is removed once
  sent (or once the client hung up).

`cleanup_now` is what the other upload routes (image, label, model, `/infer`) run when they refuse a request:
MONAI Label queues the removal of an upload's temporary file as a background task, and Starlette runs background
tasks only after a successful answer.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import List, Optional

from fastapi import BackgroundTasks, Depends, FastAPI, File, HTTPException, UploadFile
from fastapi.responses import FileResponse
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User
from monailabel.interfaces.utils.app import app_instance

from rocm_zoo.engine.volume_check import check_dicom_budget, check_volume, is_volume_name
from rocm_zoo.server.store import archives

logger = logging.getLogger(__name__)


def cleanup_now(background_tasks: Optional[BackgroundTasks]) -> None:
    """Runs, once, what `background_tasks` would have run after a successful answer (MONAI Label's upload routes
    queue only the removal of their temporary files there)."""
    if background_tasks is None:
        return
    tasks, background_tasks.tasks[:] = list(background_tasks.tasks), []
    for task in tasks:
        try:
            task.func(*task.args, **task.kwargs)
        except Exception:
            logger.warning("cleaning up after a refused upload failed", exc_info=True)


class RemovedAfterSending(FileResponse):
    """A temporary file sent, then removed, whether the client read it all or hung up."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            archives.remove(self.path)


def install(web: FastAPI, limits: archives.ArchiveLimits = archives.ArchiveLimits()) -> None:
    before = len(web.router.routes)

    @web.put("/session/", summary="Create a new session with an image (an archive is unpacked with uncompress=true)",
             tags=["Session"])
    def api_create_session(background_tasks: BackgroundTasks, uncompress: bool = False, expiry: int = 0,
                           files: List[UploadFile] = File(...),
                           user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER))):
        return create_session(files, uncompress, expiry, limits)

    @web.get("/datastore/dataset", summary="Download the labelled studies as a ZIP archive", tags=["Datastore"])
    def api_download_dataset(limit_cases: Optional[int] = None,
                             user: User = Depends(RBAC(settings.MONAI_LABEL_AUTH_ROLE_ANNOTATOR))):
        path = app_instance().datastore().get_dataset_archive(limit_cases)
        return RemovedAfterSending(path, media_type="application/zip", filename="dataset.zip")

    ours = web.router.routes[before:]
    del web.router.routes[before:]
    web.router.routes[0:0] = ours
    web.openapi_schema = None


def create_session(files: List[UploadFile], uncompress: bool, expiry: int,
                   limits: archives.ArchiveLimits) -> dict:
    sessions = app_instance().sessions()
    if sessions is None:
        raise HTTPException(status_code=406, detail="Session Feature is Not Enabled")
    if not files:
        raise HTTPException(status_code=404, detail="Image(s) Not Found")
    received = Path(tempfile.mkdtemp(prefix="session-"))
    session_id = str(uuid.uuid1()).lower()
    try:
        written = [_receive(f, received, i) for i, f in enumerate(files)]
        if uncompress and len(written) == 1:  # MONAI Label unpacks a single upload only
            image = received / "image"
            volumes = archives.extract(written[0], image, limits)
            archives.remove(written[0])
        else:
            image = written[0] if len(written) == 1 else received
            volumes = written
        for path in volumes:
            check_volume(path, path.name)
        _check_dicom_budget(volumes)
        session_id, info = sessions.add_session(str(image), expiry, uncompress=False, session_id=session_id)
    except BaseException:
        sessions.remove_session(session_id)
        raise
    finally:
        archives.remove(received)
    shown = info.to_json()
    shown["path"], shown["image"] = session_id, os.path.basename(info.image)
    return {"session_id": session_id, "session_info": shown}


def _check_dicom_budget(paths: List[Path]) -> None:
    """The DICOM files of a session, from their headers: within the volume budget once converted."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    headers = []
    for path in paths:
        if is_volume_name(path.name):
            continue
        try:
            header = pydicom.dcmread(str(path), stop_before_pixels=True)
        except (InvalidDicomError, OSError, ValueError, EOFError):
            continue
        if "Rows" in header:
            headers.append(header)
    if headers:
        check_dicom_budget("the session's DICOM images", headers)


def _receive(upload: UploadFile, folder: Path, index: int) -> Path:
    name = os.path.basename((upload.filename or "").replace("\\", "/"))
    if not name or name in (".", "..") or "\x00" in name:
        name = f"upload-{index}"
    path = folder / name
    if path.exists():
        path = folder / f"{index}-{name}"
    with open(path, "xb") as out:
        while True:
            chunk = upload.file.read(archives.CHUNK)
            if not chunk:
                break
            out.write(chunk)
    return path
