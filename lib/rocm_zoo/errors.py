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


class PacsUnavailable(RocmZooError):
    """The DICOMweb PACS did not answer (down, or refusing); the request can be retried once it is back."""

    status = 503
