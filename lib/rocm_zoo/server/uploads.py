"""Uploads are checked before anything is stored: a size limit on every request body, and a label must be a readable
volume of integer values on exactly its image's voxel grid.

`BodyLimit` is an ASGI middleware: a body announced larger than `--conf max_upload_mb` is refused (413) before it is
read, and one that streams past the limit without announcing its length is cut off there (413). `check_label` is
what the datastores run on every label before they store it (uploads from viewers, labels a model wrote, batch
labels): an unreadable file, a label of another shape, spacing, origin or orientation than its image, or non-integer
values is a 422 with the reason.
"""

from __future__ import annotations

import json
import os

import numpy as np

from rocm_zoo.errors import InvalidRequest, RocmZooError


class TooLarge(RocmZooError):
    """The request body is over `--conf max_upload_mb`."""

    status = 413


class BodyLimit:
    """ASGI middleware refusing request bodies over `max_bytes` (413, with the limit in the reason)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = int(max_bytes)

    def _refusal(self) -> bytes:
        mb = self.max_bytes / 2**20
        return json.dumps({"detail": f"The upload is larger than this server accepts ({mb:g} MiB; "
                                     "--conf max_upload_mb)"}).encode()

    async def _refuse(self, send) -> None:
        body = self._refusal()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    announced = -1
                if announced > self.max_bytes:
                    return await self._refuse(send)
        seen = 0
        over = False
        refused = False

        async def limited_receive():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise TooLarge(self._refusal().decode())
            return message

        async def guarded_send(message):
            # Past the limit, whatever the route answers (FastAPI turns a broken body into a 400) becomes the 413.
            nonlocal refused
            if over:
                if not refused:
                    refused = True
                    await self._refuse(send)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
            if not refused:
                refused = True
                await self._refuse(send)


def install_body_limit(app, max_mb: float) -> None:
    """Adds BodyLimit to MONAI Label's FastAPI app after it started (Starlette builds its middleware stack on the
    first request; dropping it makes the next request build it again, with this one outermost)."""
    from starlette.middleware import Middleware

    app.user_middleware.insert(0, Middleware(BodyLimit, max_bytes=int(max_mb * 2**20)))
    app.middleware_stack = None


# --- label checks ----------------------------------------------------------------------------------------------------

def _header(path: str):
    import SimpleITK as sitk

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    reader.ReadImageInformation()
    return reader


def check_label(label_path: str, image_path: str | None, name: str = "label") -> None:
    """A label that can be stored for its image, or InvalidRequest saying why not."""
    import SimpleITK as sitk

    try:
        label = sitk.ReadImage(str(label_path))
        values = sitk.GetArrayViewFromImage(label)
    except Exception as e:
        raise InvalidRequest(f"The {name} is not a readable volume (NIfTI or NRRD label expected): "
                             f"{str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__}") from e
    if label.GetDimension() != 3 or label.GetNumberOfComponentsPerPixel() != 1:
        raise InvalidRequest(f"The {name} must be one 3D volume of label values, not {label.GetDimension()}D with "
                             f"{label.GetNumberOfComponentsPerPixel()} components")
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or not np.array_equal(values, np.round(values)):
            raise InvalidRequest(f"The {name} holds non-integer values: labels are whole numbers (0 background)")
    elif values.dtype.kind not in "iub":
        raise InvalidRequest(f"The {name} has pixel type {values.dtype}; labels are whole numbers")
    if values.size and values.min() < 0:
        raise InvalidRequest(f"The {name} holds negative values: labels are 0 (background) or more")
    if not image_path or os.path.isdir(image_path) or not os.path.isfile(image_path):
        return  # a DICOM folder or no image file: MONAI Label's to judge
    try:
        image = _header(image_path)
    except Exception:
        return  # the image is the datastore's; a format ITK cannot read is not the label's fault
    size, isize = tuple(label.GetSize()), tuple(image.GetSize()[:3])
    if size != isize:
        raise InvalidRequest(f"The {name} has size {size} but its image has {isize}: a label must lie on its "
                             "image's voxel grid")
    spacing, ispacing = np.asarray(label.GetSpacing()), np.asarray(image.GetSpacing()[:3])
    if not np.allclose(spacing, ispacing, rtol=1e-3, atol=1e-4):
        raise InvalidRequest(f"The {name} has spacing {tuple(np.round(spacing, 4))} but its image has "
                             f"{tuple(np.round(ispacing, 4))}")
    origin, iorigin = np.asarray(label.GetOrigin()), np.asarray(image.GetOrigin()[:3])
    if not np.allclose(origin, iorigin, atol=max(1e-2, 1e-3 * float(ispacing.max()))):
        raise InvalidRequest(f"The {name}'s origin {tuple(np.round(origin, 3))} is not its image's "
                             f"{tuple(np.round(iorigin, 3))}")
    direction = np.asarray(label.GetDirection()).reshape(3, 3)
    idirection = np.asarray(image.GetDirection()).reshape(image.GetDimension(), -1)[:3, :3]
    if not np.allclose(direction, idirection, atol=1e-3):
        raise InvalidRequest(f"The {name}'s orientation differs from its image's")
