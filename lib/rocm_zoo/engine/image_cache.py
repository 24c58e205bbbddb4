"""Preprocessed images kept between clicks, bounded in bytes, keyed by file identity.

An interactive session clicks many times on one image; loading and preprocessing it once is the difference between
a click that feels instant and one that does not. A key holds the file's path, size and modification time, so a
replaced file is never served stale.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict
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
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_make(self, key: tuple, make: Callable[[], dict]) -> dict:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return fresh_copy(entry)
        entry = make()
        with self._lock:
            self.misses += 1
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._evict()
        return fresh_copy(entry)

    def _evict(self) -> None:
        while len(self._entries) > 1 and self.size_bytes() > self.max_bytes:
            self._entries.popitem(last=False)

    def size_bytes(self) -> int:
        return sum(_nbytes(v) for e in self._entries.values() for v in e.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
