"""Which images a request may name: datastore ids (or series of the configured PACS), never server paths.

MONAI Label's `MONAILabelApp.infer` takes any path that exists on the server as the image. Here a request names a
datastore id; a server path is refused as "not in the datastore" (404) unless `--conf allow_local_paths true` (a
single-user workstation). Two kinds of server file are still accepted because MONAI Label's own routes make them:
the temporary file an upload (`file` of `/infer`) was written to, and a session's image.

Ids and label tags become file names under the datastore folder, so they are checked too (no `..`, no separators).
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Iterable

from rocm_zoo.errors import ImageNotFound, InvalidRequest, RocmZooError

# What tempfile.NamedTemporaryFile(suffix=ext).name gives MONAI Label's upload routes: tmp + 8 characters + ext.
_UPLOAD_NAME = re.compile(r"^tmp[a-z0-9_]{8}(\.[A-Za-z0-9]{1,8}){0,3}$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
_PATHLIKE = re.compile(r"(?<![:/\w.])(?:/[^\s'\"/:,;)]+){2,}/?")


def is_upload_temp(path: str) -> bool:
    """True for the temporary file MONAI Label's route wrote an uploaded image to (a file of the system temp folder
    named as NamedTemporaryFile names them)."""
    try:
        real = os.path.realpath(path)
    except (TypeError, ValueError):
        return False
    return (os.path.dirname(real) == os.path.realpath(tempfile.gettempdir())
            and bool(_UPLOAD_NAME.match(os.path.basename(real))) and os.path.isfile(real))


def in_datastore(store, image_id: str) -> bool:
    """Whether the datastore knows the id (for a PACS: the series exists there; that look-up raises its own typed
    error when it can say more: ImageNotFound, PacsUnavailable, or a series refused as not a CT volume)."""
    objects = getattr(getattr(store, "_datastore", None), "objects", None)
    if objects is not None and image_id in objects and not _is_dicomweb(store):
        return True
    try:
        return bool(store.get_image_uri(image_id))
    except RocmZooError:
        raise
    except (OSError, ValueError, KeyError):
        return False


def _is_dicomweb(store) -> bool:
    return hasattr(store, "series_signature")


def check_image(image, store, allow_local_paths: bool, session_dirs: Iterable[str] = ()) -> None:
    """Raises ImageNotFound (404) unless `image` is a datastore id, an upload's or session's file, or (with
    allow_local_paths) an existing server file. The message never names a server path."""
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequest("The request names no image: give a datastore image id (?image=ID) or upload a file")
    if is_upload_temp(image):
        return
    real = os.path.realpath(image) if os.path.isabs(image) else ""
    if real and any(real.startswith(os.path.realpath(d) + os.sep) for d in session_dirs if d):
        return
    if allow_local_paths and os.path.isfile(image):
        return
    if not looks_like_path(image) and in_datastore(store, image):
        return
    raise ImageNotFound(f"Image '{shown(image)}' is not in the datastore" + (
        "; requests name datastore image ids, not server paths" if looks_like_path(image) else ""))


def check_ids(image_ids, store) -> list[str]:
    """A batch's `image_ids`: a list of datastore ids, every one known (404 naming the unknown ones)."""
    if not isinstance(image_ids, list) or not all(isinstance(i, str) and i for i in image_ids):
        raise InvalidRequest("image_ids takes a list of datastore image ids (strings)")
    unknown = [i for i in image_ids if looks_like_path(i) or not in_datastore(store, i)]
    if unknown:
        listed = ", ".join(shown(i) for i in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ImageNotFound(f"{len(unknown)} of image_ids not in the datastore: {listed}")
    return list(image_ids)


def looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith(".") or value.startswith("~")


def check_name(value: str, what: str) -> str:
    """An image id or label tag that becomes a file or folder name in the datastore."""
    if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
        raise InvalidRequest(f"{what} '{shown(str(value))}' is not allowed: use letters, digits, '_', '-' and '.' "
                             "(not first), at most 200 characters")
    return value


def shown(text: str, limit: int = 80) -> str:
    """Text from a request, safe to echo: a path is reduced to its last part, long text is cut."""
    text = redact(str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The server's own routes, which messages name for the client ("GET /batch/infer for its progress"): not server paths.
API_ROUTES = ("activelearning", "auth", "batch", "datastore", "health", "infer", "info", "logs", "model", "ohif",
              "proxy", "scoring", "session", "train")


def redact(message: str) -> str:
    """A message with every absolute server path replaced by its file name (the server's routes are kept)."""
    def cut(m: re.Match) -> str:
        path = m.group(0)
        if path.split("/")[1] in API_ROUTES and ".." not in path:
            return path
        return os.path.basename(path.rstrip("/")) or "<path>"

    return _PATHLIKE.sub(cut, str(message))
