"""Typed errors. Each carries the HTTP status the server answers with, so the web layer maps them in one place."""


class RocmZooError(Exception):
    """Base class; `status` is the HTTP status a request that raised it gets."""

    status = 500


class ConfigError(RocmZooError, ValueError):
    """A `--conf` value or an overlay key that is not understood."""

    status = 400


class BundleNotFound(RocmZooError):
    """A model was asked for whose bundle is not in the model folder."""

    status = 404


class InvalidRequest(RocmZooError, ValueError):
    """A request the task cannot run: bad clicks, unknown label, unreadable image..."""

    status = 422


class CheckpointNotFound(RocmZooError):
    """A rollback names a checkpoint the bundle does not keep."""

    status = 404


class ImageNotFound(RocmZooError):
    """The image id is not in the datastore."""

    status = 404


class ModelNotFound(RocmZooError):
    """The request names a model this server does not serve."""

    status = 404


class Busy(RocmZooError):
    """A batch is already running; one at a time keeps the GPU for it and the clicks."""

    status = 409


class VolumeTooLarge(RocmZooError):
    """The volume does not fit in the accelerator's memory even with the fallbacks."""

    status = 507


class UploadTooLarge(RocmZooError):
    """An upload announces, or inflates to, more than the server accepts (body, archive or volume budget)."""

    status = 413


class AlreadyExists(RocmZooError):
    """The upload would replace something that others depend on (an image with labels); delete it first."""

    status = 409


class PacsUnavailable(RocmZooError):
    """The DICOMweb PACS did not answer (down, or refusing); the request can be retried once it is back."""

    status = 503


class PacsTimeout(RocmZooError):
    """The DICOMweb PACS took a connection or a request and did not answer in time (`--conf pacs_*_timeout_s`)."""

    status = 504


class QueueFull(RocmZooError):
    """The queue of this class of work is full; the client should try again after `retry_after_s`."""

    status = 503

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(RocmZooError):
    """The request did not finish within `--conf request_timeout_s`; its remaining work was dropped."""

    status = 504


class WorkCancelled(RocmZooError):
    """The client went away; its work stopped at its next turn on the device. No client ever sees this answer."""

    status = 499


class TrainingRunning(RocmZooError):
    """A training is already running; MONAI Label answers a second train request with 429 too."""

    status = 429


class NotOnThisServer(RocmZooError):
    """What the route reports does not exist here: it needs a program or device this server does not have (e.g.
    `nvidia-smi`). A 404, not a 5xx: nothing failed, and nothing will change by asking again."""

    status = 404
