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

from rocm_zoo.engine.volume_check import budget, check_volume, first_line, integral_label_values, read_header
from rocm_zoo.errors import InvalidRequest, UploadTooLarge


class TooLarge(UploadTooLarge):
    """The request body is over `--conf max_upload_mb`."""


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
    """A label that can be stored for its image, or InvalidRequest (422) / UploadTooLarge (413) saying why not.
    Header first: the label's size, pixel type and geometry against the budget and its image's header, then its
    values streamed through (complete, finite, whole, not negative); never inflated whole."""
    header = read_header(label_path, name)
    if header is None:
        _check_label_other_format(label_path, name)
    else:
        shape = header.shape[:3] if len(header.shape) == 3 or header.shape[3:] == (1,) else header.shape
        if len(shape) != 3:
            raise InvalidRequest(f"The {name} must be one 3D volume of label values, not of shape {header.shape}")
        budget().check(header.shape, header.dtype.itemsize, name)
    _check_geometry(label_path, image_path, name)
    if header is not None:
        check_volume(label_path, name, values=integral_label_values(name))


def _check_label_other_format(label_path: str, name: str) -> None:
    """A label ITK reads but this module does not parse (e.g. .mha): its header's size against the budget, then
    read whole by ITK."""
    import SimpleITK as sitk

    try:
        info = _header(label_path)
        budget().check(tuple(info.GetSize()), max(1, info.GetNumberOfComponents()) * 8, name)
        label = sitk.ReadImage(str(label_path))
        values = sitk.GetArrayViewFromImage(label)
    except (InvalidRequest, UploadTooLarge):
        raise
    except Exception as e:
        raise InvalidRequest(f"The {name} is not a readable volume (NIfTI or NRRD label expected): "
                             f"{first_line(e, 200)}") from e
    if label.GetDimension() != 3 or label.GetNumberOfComponentsPerPixel() != 1:
        raise InvalidRequest(f"The {name} must be one 3D volume of label values, not {label.GetDimension()}D with "
                             f"{label.GetNumberOfComponentsPerPixel()} components")
    integral_label_values(name)(values)


def _check_geometry(label_path: str, image_path: str | None, name: str) -> None:
    """The label's header against its image's: same voxel grid (size, spacing, origin, orientation)."""
    try:
        label = _header(label_path)
    except Exception as e:
        raise InvalidRequest(f"The {name} is not a readable volume (NIfTI or NRRD label expected): "
                             f"{first_line(e, 200)}") from e
    if label.GetNumberOfComponents() != 1:
        raise InvalidRequest(f"The {name} must be one volume of label values, not {label.GetNumberOfComponents()} "
                             "components")
    if not image_path or os.path.isdir(image_path) or not os.path.isfile(image_path):
        return  # a DICOM folder or no image file: MONAI Label's to judge
    try:
        image = _header(image_path)
    except Exception:
        return  # the image is the datastore's; a format ITK cannot read is not the label's fault
    size, isize = tuple(label.GetSize()[:3]), tuple(image.GetSize()[:3])
    if size != isize:
        raise InvalidRequest(f"The {name} has size {size} but its image has {isize}: a label must lie on its "
                             "image's voxel grid")
    spacing, ispacing = np.asarray(label.GetSpacing()[:3]), np.asarray(image.GetSpacing()[:3])
    if not np.allclose(spacing, ispacing, rtol=1e-3, atol=1e-4):
        raise InvalidRequest(f"The {name} has spacing {tuple(np.round(spacing, 4))} but its image has "
                             f"{tuple(np.round(ispacing, 4))}")
    origin, iorigin = np.asarray(label.GetOrigin()[:3]), np.asarray(image.GetOrigin()[:3])
    if not np.allclose(origin, iorigin, atol=max(1e-2, 1e-3 * float(ispacing.max()))):
        raise InvalidRequest(f"The {name}'s origin {tuple(np.round(origin, 3))} is not its image's "
                             f"{tuple(np.round(iorigin, 3))}")
    direction = np.asarray(label.GetDirection()).reshape(label.GetDimension(), -1)[:3, :3]
    idirection = np.asarray(image.GetDirection()).reshape(image.GetDimension(), -1)[:3, :3]
    if not np.allclose(direction, idirection, atol=1e-3):
        raise InvalidRequest(f"The {name}'s orientation differs from its image's")
