"""The app's `--conf` options, parsed once into a frozen dataclass. Unknown keys are an error naming the near miss."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from rocm_zoo.errors import ConfigError
from rocm_zoo.names import did_you_mean
from rocm_zoo.registry import select_models

# Keys MONAI Label itself reads from --conf; accepted and left to it.
MONAILABEL_KEYS = ("server_mode",)
BATCH_ENGINES = ("inprocess", "ray")


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
    batch_engine: str = "inprocess"  # /batch/infer: "inprocess" (the server's warm models) or "ray" (Ray workers)
    ray_address: str = ""  # with batch_engine ray: a Ray cluster to join ("" starts a local one on 127.0.0.1)
    ray_workers: int = 0  # with batch_engine ray: workers (0: one per GPU of the cluster, or one on a CPU machine)
    request_timeout_s: float = 600.0  # a request not answered by then gets 504 and its remaining work is dropped
    max_queued_clicks: int = 32  # interactive requests waiting; one more gets 503 with Retry-After
    max_queued_requests: int = 8  # automatic (single-study) requests waiting; one more gets 503 with Retry-After

    @classmethod
    def from_conf(cls, conf: dict[str, str]) -> AppConfig:
        known = [f.name for f in fields(cls)]
        for key in conf:
            if key not in known and key not in MONAILABEL_KEYS:
                hint = did_you_mean(key, known)
                raise ConfigError(f"Unknown --conf key '{key}'.{hint} Known keys: {', '.join(known)}")
        return cls(
            models=select_models(conf.get("models", "all")),
            device=conf.get("device", cls.device),
            warmup=_bool("warmup", conf.get("warmup", "true")),
            image_cache_gb=_gigabytes(conf, "image_cache_gb", cls.image_cache_gb),
            dicom_cache_gb=_gigabytes(conf, "dicom_cache_gb", cls.dicom_cache_gb),
            batch_engine=_choice(conf, "batch_engine", BATCH_ENGINES, cls.batch_engine),
            ray_address=conf.get("ray_address", cls.ray_address),
            ray_workers=_count(conf, "ray_workers", cls.ray_workers),
            request_timeout_s=_seconds(conf, "request_timeout_s", cls.request_timeout_s),
            max_queued_clicks=_count(conf, "max_queued_clicks", cls.max_queued_clicks),
            max_queued_requests=_count(conf, "max_queued_requests", cls.max_queued_requests),
        )


def _choice(conf: dict[str, str], key: str, choices: tuple[str, ...], default: str) -> str:
    value = conf.get(key, default)
    if value not in choices:
        raise ConfigError(f"--conf {key} takes one of {', '.join(choices)}, not '{value}'")
    return value


def _count(conf: dict[str, str], key: str, default: int) -> int:
    return _non_negative(conf, key, default, int, "a whole number")


def _seconds(conf: dict[str, str], key: str, default: float) -> float:
    value = _non_negative(conf, key, default, float, "a number of seconds")
    if value == 0:
        raise ConfigError(f"--conf {key} takes a number of seconds > 0, not '{conf[key]}'")
    return value


def _gigabytes(conf: dict[str, str], key: str, default: float) -> float:
    return _non_negative(conf, key, default, float, "a finite number")


def _non_negative(conf: dict[str, str], key: str, default, parse, kind: str):
    try:
        value = parse(conf.get(key, default))
    except ValueError:
        value = None
    if value is None or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"--conf {key} takes {kind} >= 0, not '{conf[key]}'")
    return value
