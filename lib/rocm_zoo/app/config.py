"""The app's `--conf` options, parsed once into a frozen dataclass. Unknown keys are an error naming the near miss."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from rocm_zoo.errors import ConfigError
from rocm_zoo.names import did_you_mean
from rocm_zoo.registry import TASKS, batch_models, select_models

# Keys MONAI Label itself reads from --conf; accepted and left to it.
MONAILABEL_KEYS = ("server_mode",)
BATCH_ENGINES = ("inprocess", "ray")
AUTH_MODES = ("auto", "on", "off")  # auto: on as soon as the server listens beyond loopback
MAX_FLIPS = 7  # every combination of the three axes (rocm_zoo.engine.flip_uncertainty.FLIP_AXES)


def _bool(key: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"--conf {key} takes true or false, not '{value}'")


@dataclass(frozen=True)
class AppConfig:
    models: tuple[str, ...]
    device: str = "auto"  # "auto" (GPU if there is one), "cuda", "cuda:1", "cpu"
    warmup: bool = True  # compile and warm at start-up; off only for debugging
    image_cache_gb: float = 4.0  # preprocessed images kept on the device between clicks
    dicom_cache_gb: float = 8.0  # DICOMweb series kept on disk, downloaded and converted, between requests
    pacs_connect_timeout_s: float = 5.0  # every call to the DICOMweb PACS (datastore and /proxy/dicom): connecting
    pacs_read_timeout_s: float = 60.0  # ... and waiting for each answer (never past the request's own deadline)
    batch_engine: str = "inprocess"  # /batch/infer: "inprocess" (the server's warm models) or "ray" (Ray workers)
    ray_address: str = ""  # with batch_engine ray: a Ray cluster to join ("" starts a local one on 127.0.0.1)
    ray_workers: int = 0  # with batch_engine ray: workers (0: one per GPU of the cluster, or one on a CPU machine)
    request_timeout_s: float = 600.0  # a request not answered by then gets 504 and its remaining work is dropped
    max_queued_clicks: int = 32  # interactive requests waiting; one more gets 503 with Retry-After
    max_queued_requests: int = 8  # automatic (single-study) requests waiting; one more gets 503 with Retry-After
    interactive_stream: bool = True  # clicks' GPU work on a high-priority stream of their own (engine.streams)
    switch_interval_ms: float = 5.0  # the interpreter's thread switch interval (sys.setswitchinterval): how long a
    # thread that gave the GIL up for a torch operation may wait to get it back while another thread runs Python
    gc_freeze: bool = True  # after warm-up, the warm heap out of the garbage collector's reach (app.heap)
    allow_local_paths: bool = False  # requests may name a server file instead of a datastore id (single-user only)
    max_upload_mb: float = 2048.0  # largest request body (image or label upload) in MiB
    # The largest volume read from a client (image, label, session, DICOM series), judged from its header before
    # anything is inflated: a 1024x1024x2000 CT (2.1e9 voxels, 8.4 GB as float32) with 5 % to spare.
    max_volume_voxels: int = 2_200_000_000
    max_volume_gb: float = 8.8  # its voxel data at the file's own type, in GB (1e9 bytes)
    auth: str = "auto"  # auto (on beyond loopback), on, off; Keycloak (MONAI_LABEL_AUTH_ENABLE) wins when set
    users_file: str = ""  # local users (rocm-zoo users); "" is <app>/users.json
    token_hours: float = 12.0  # lifetime of a login token
    audit: bool = True  # the audit trail (<app>/logs/audit.jsonl); off only to measure what it costs
    cors_origins: tuple[str, ...] = ()  # browser origins (viewers served elsewhere) allowed to call the API
    allowed_hosts: tuple[str, ...] = ()  # on loopback, Host names besides localhost/127.x/::1 (a proxy's own name)
    train_device: str = ""  # where trainings run: "" the server's device (lowest priority there), or e.g. "cuda:1"
    uncertainty_model: str = ""  # /activelearning/uncertainty ranks with it ("": the first automatic model served)
    uncertainty_flips: int = 2  # flipped predictions besides the plain one: (flips + 1) network runs per study
    uncertainty_max_new: int = 8  # studies an /activelearning/uncertainty call scores at most (the rest: next calls)

    @classmethod
    def from_conf(cls, conf: dict[str, str]) -> AppConfig:
        known = [f.name for f in fields(cls)]
        for key in conf:
            if key not in known and key not in MONAILABEL_KEYS:
                hint = did_you_mean(key, known)
                raise ConfigError(f"Unknown --conf key '{key}'.{hint} Known keys: {', '.join(known)}")
        models = select_models(conf.get("models", "all"))
        return cls(
            models=models,
            device=conf.get("device", cls.device),
            warmup=_bool("warmup", conf.get("warmup", "true")),
            image_cache_gb=_gigabytes(conf, "image_cache_gb", cls.image_cache_gb),
            dicom_cache_gb=_gigabytes(conf, "dicom_cache_gb", cls.dicom_cache_gb),
            pacs_connect_timeout_s=_positive(conf, "pacs_connect_timeout_s", cls.pacs_connect_timeout_s),
            pacs_read_timeout_s=_positive(conf, "pacs_read_timeout_s", cls.pacs_read_timeout_s),
            batch_engine=_choice(conf, "batch_engine", BATCH_ENGINES, cls.batch_engine),
            ray_address=conf.get("ray_address", cls.ray_address),
            ray_workers=_count(conf, "ray_workers", cls.ray_workers),
            request_timeout_s=_positive(conf, "request_timeout_s", cls.request_timeout_s),
            max_queued_clicks=_count(conf, "max_queued_clicks", cls.max_queued_clicks),
            max_queued_requests=_count(conf, "max_queued_requests", cls.max_queued_requests),
            interactive_stream=_bool("interactive_stream", conf.get("interactive_stream", "true")),
            switch_interval_ms=_positive(conf, "switch_interval_ms", cls.switch_interval_ms),
            gc_freeze=_bool("gc_freeze", conf.get("gc_freeze", "true")),
            allow_local_paths=_bool("allow_local_paths", conf.get("allow_local_paths", "false")),
            max_upload_mb=_positive(conf, "max_upload_mb", cls.max_upload_mb),
            max_volume_voxels=int(_positive(conf, "max_volume_voxels", cls.max_volume_voxels)),
            max_volume_gb=_positive(conf, "max_volume_gb", cls.max_volume_gb),
            auth=_choice(conf, "auth", AUTH_MODES, cls.auth),
            users_file=conf.get("users_file", cls.users_file),
            token_hours=_positive(conf, "token_hours", cls.token_hours),
            audit=_bool("audit", conf.get("audit", "true")),
            cors_origins=_origins(conf.get("cors_origins", "")),
            allowed_hosts=_host_names(conf.get("allowed_hosts", "")),
            train_device=conf.get("train_device", cls.train_device),
            uncertainty_model=_uncertainty_model(conf.get("uncertainty_model", cls.uncertainty_model), models),
            uncertainty_flips=_within(conf, "uncertainty_flips", cls.uncertainty_flips, 1, MAX_FLIPS),
            uncertainty_max_new=_within(conf, "uncertainty_max_new", cls.uncertainty_max_new, 1, None),
        )


def _uncertainty_model(name: str, models: tuple[str, ...]) -> str:
    """An automatic segmentation task of a served model, or "" (the app picks the first one served)."""
    if not name:
        return ""
    automatic = batch_models()
    if name not in automatic:
        hint = did_you_mean(name, automatic)
        raise ConfigError(f"--conf uncertainty_model takes an automatic segmentation model, not '{name}'.{hint} "
                          f"Known: {', '.join(automatic)}")
    if TASKS[name].model not in models:
        raise ConfigError(f"--conf uncertainty_model {name} is not served: add {TASKS[name].model} to --conf models")
    return name


def _within(conf: dict[str, str], key: str, default: int, low: int, high: int | None) -> int:
    try:
        value = int(conf.get(key, default))
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f">= {low}"
        raise ConfigError(f"--conf {key} takes a whole number {allowed}, not '{conf[key]}'")
    return value


def _choice(conf: dict[str, str], key: str, choices: tuple[str, ...], default: str) -> str:
    value = conf.get(key, default)
    if value not in choices:
        raise ConfigError(f"--conf {key} takes one of {', '.join(choices)}, not '{value}'")
    return value


def _count(conf: dict[str, str], key: str, default: int) -> int:
    return _non_negative(conf, key, default, int, "a whole number")


def _gigabytes(conf: dict[str, str], key: str, default: float) -> float:
    return _non_negative(conf, key, default, float, "a finite number")


def _positive(conf: dict[str, str], key: str, default: float) -> float:
    value = _non_negative(conf, key, default, float, "a finite number")
    if value <= 0:
        raise ConfigError(f"--conf {key} takes a number > 0, not '{conf[key]}'")
    return value


def _host_names(value: str) -> tuple[str, ...]:
    """A comma list of host names or addresses (no scheme, no port), lower case; '*' is refused: it would let any
    web page's name reach a loopback server (DNS rebinding)."""
    out = []
    for name in (n.strip().lower().rstrip(".") for n in str(value).split(",")):
        if not name:
            continue
        if not re.fullmatch(r"[a-z0-9]([a-z0-9\-.]*[a-z0-9])?|[0-9a-f:]+", name) or ".." in name:
            raise ConfigError(f"--conf allowed_hosts takes a comma list of host names like pacs-gw.hospital.example "
                              f"(no scheme, no port), not '{name}'")
        out.append(name)
    return tuple(dict.fromkeys(out))


def _origins(value: str) -> tuple[str, ...]:
    """A comma list of browser origins (scheme://host[:port]); '*' is refused: any web page could then use a
    logged-in viewer's token."""
    out = []
    for origin in (o.strip().rstrip("/") for o in str(value).split(",")):
        if not origin:
            continue
        if origin == "*" or not origin.startswith(("http://", "https://")) or "/" in origin.split("://", 1)[1]:
            raise ConfigError(f"--conf cors_origins takes a comma list of origins like https://viewer.example:3000, "
                              f"not '{origin}'")
        out.append(origin)
    return tuple(dict.fromkeys(out))


def _non_negative(conf: dict[str, str], key: str, default, parse, kind: str):
    try:
        value = parse(conf.get(key, default))
    except ValueError:
        value = None
    if value is None or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"--conf {key} takes {kind} >= 0, not '{conf[key]}'")
    return value
