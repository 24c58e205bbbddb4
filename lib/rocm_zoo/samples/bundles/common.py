"""What every sample bundle writer shares: file writes (the engine's atomic writer) and the mark that tells a sample
from a real bundle."""

from __future__ import annotations

import json
from pathlib import Path

from rocm_zoo.engine.atomic_files import atomic_torch_save, atomic_write_text

SIZES = ("tiny", "full")
# How metadata describes the committed tiny weights (rocm_zoo/samples/weights).
TRAINED = "trained on rocm_zoo's synthetic phantoms (rocm-zoo train-sample)"
SAMPLE_MARK = "rocm_zoo.sample"  # in metadata.json "version" of every sample bundle; real bundles never carry it
# Data loading of the tiny training configs (full keeps upstream's): a CPU test trains on a few small phantoms for an
# epoch, where worker processes and a cache of the deterministic transforms would only add start-up time.
TINY_NUM_WORKERS = 0
TINY_CACHE_RATE = 0.0


def check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, not '{size}'")


def sample_version(upstream_version: str, size: str) -> str:
    return f"{upstream_version}+{SAMPLE_MARK}.{size}"


def is_sample(bundle_dir: Path) -> bool:
    """True for a folder rocm_zoo may (re)write: empty, or holding one of its own samples."""
    meta = Path(bundle_dir) / "configs" / "metadata.json"
    return not meta.exists() or SAMPLE_MARK in meta.read_text()


def write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=4) + "\n")


def write_torch(path: Path, obj) -> None:
    atomic_torch_save(path, obj)
