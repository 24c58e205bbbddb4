"""Preprocessed images kept between clicks, bounded in bytes, keyed by file identity.

An interactive session clicks many times on one image; loading and preprocessing it once is the difference between
a click that feels instant and one that does not. A key holds the file's path, size and modification time, so a
replaced file is never served stale.
"""

from __future__ import annotations

import copy
import os
from typing import Callable

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

from rocm_zoo.engine.lru import StreamCache

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


class ImageCache(StreamCache[tuple, dict]):
    """Preprocessed images (dicts of tensors), least recently used first out beyond `max_bytes`; the newest is kept.
    Every caller gets a fresh copy, so the cached entry is never changed."""

    def get_or_make(self, key: tuple, make: Callable[[], dict], keep: bool = True) -> dict:
        """The cached entry for `key`, or `make()`'s, kept for next time unless `keep` is false."""
        entry = self.get(key)
        if entry is not None:
            return fresh_copy(entry)
        entry = make()
        if not keep:
            return entry
        self.put(key, entry)
        return fresh_copy(entry)

    def clear(self) -> None:
        self._entries.clear()
