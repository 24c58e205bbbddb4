"""Preprocessed images kept between clicks, bounded in bytes, keyed by file identity.

An interactive session clicks many times on one image; loading and preprocessing it once is the difference between
a click that feels instant and one that does not. A key holds the file's path, size and modification time, so a
replaced file is never served stale.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any, Callable

import torch
from monai.transforms import (
    CastToTyped,
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImaged,
    NormalizeIntensityd,
    Orientationd,
    ScaleIntensityRanged,
    Spacingd,
)

from rocm_zoo.engine import streams
from rocm_zoo.engine.lru import ByteLRU

# Deterministic transforms that depend on the image alone: their output can be reused for every click on that image.
IMAGE_ONLY_TRANSFORMS = (
    LoadImaged,
    EnsureChannelFirstd,
    Orientationd,
    Spacingd,
    ScaleIntensityRanged,
    NormalizeIntensityd,
    EnsureTyped,
    CastToTyped,
)


def file_identity(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def split_image_only(transforms, kinds: tuple = IMAGE_ONLY_TRANSFORMS) -> tuple[list, list]:
    """The leading run of image-only transforms (cacheable per image) and the rest."""
    n = 0
    while n < len(transforms) and isinstance(transforms[n], kinds):
        n += 1
    return list(transforms[:n]), list(transforms[n:])


def _nbytes(value: Any) -> int:
    return value.element_size() * value.nelement() if torch.is_tensor(value) else 0


def fresh_copy(entry: dict) -> dict:
    """A copy the transforms may change freely: tensors cloned (with their meta and applied operations deep-copied),
    everything else deep-copied."""
    out = {}
    for k, v in entry.items():
        if torch.is_tensor(v):
            c = v.clone()
            if hasattr(v, "meta"):
                c.meta = copy.deepcopy(v.meta)
                c.applied_operations = copy.deepcopy(v.applied_operations)
            out[k] = c
        else:
            out[k] = copy.deepcopy(v)
    return out


class ImageCache:
    """Preprocessed images (dicts of tensors), least recently used first out beyond `max_bytes`; the newest is kept.
    Every caller gets a fresh copy, so the cached entry is never changed. Clicks and other requests run on different
    GPU streams (`engine.streams`): each entry keeps the event after which it is complete on the stream that made it."""

    def __init__(self, max_bytes: int):
        self._entries: ByteLRU[tuple, tuple[dict, Any]] = ByteLRU(
            max_bytes, lambda kept: sum(_nbytes(v) for v in kept[0].values()))
        self._count_lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def get_or_make(self, key: tuple, make: Callable[[], dict], keep: bool = True) -> dict:
        """The cached entry for `key`, or `make()`'s, kept for next time unless `keep` is false."""
        kept = self._entries.get(key)
        if kept is not None:
            with self._count_lock:
                self.hits += 1
            entry, made = kept
            streams.use_here(entry, made)
            return fresh_copy(entry)
        entry = make()
        with self._count_lock:
            self.misses += 1
        if not keep:
            return entry
        self._entries.put(key, (entry, streams.ready(entry)))
        return fresh_copy(entry)

    def size_bytes(self) -> int:
        return self._entries.size_bytes()

    def clear(self) -> None:
        self._entries.clear()
