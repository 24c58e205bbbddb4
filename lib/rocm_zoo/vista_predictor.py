"""What VISTA3D's inferer calls instead of the warm network: fixed class-head shapes, and the image encoder's output
kept per (image, window) for clicks.

Class prompts: the class head is compiled for a fixed number of classes, and the number a client asks for varies
(one organ, a handful, OHIF's all-but-a-few, the 117 of "everything"). Prompts of more than one class are padded to
`class_bucket` (repeats of the first class; the head embeds each class on its own, so padding changes nothing) and the
padded maps are dropped again before stitching. Two class-head shapes then serve every prompt: 1 and the bucket.

Clicks without a class (VISTA3D's point mode) run only the windows around the clicks, and every click of a request
runs its own window again. VISTA3D's forward can reuse an image embedding it is handed (`image_embeddings` with
`keep_cache=True`, point mode only), so the encoder output of each (image, window) is kept here, bounded in bytes, and
a later request that needs that window skips the encoder. With a class (OHIF's clicks) the forward needs both encoder
branches and has no such entry point, so those clicks run the encoder every time.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Hashable

import torch
from torch import nn

from rocm_zoo.pool import RUN_LOCK, WarmNetwork

# A full-size VISTA3D point-branch embedding of one 128^3 window is 48 x 128^3 values: 201 MB in bf16, so this keeps
# the last ten windows (a session of ten clicks on one image); the tiny sample's are 4 MB.
EMBEDDING_CACHE_BYTES = 2 * 2**30


class EmbeddingCache:
    """Least recently used tensors, bounded in bytes; the newest entry is always kept."""

    def __init__(self, max_bytes: int = EMBEDDING_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> torch.Tensor | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: torch.Tensor) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > 1 and self.size_bytes() > self.max_bytes:
                self._entries.popitem(last=False)

    def size_bytes(self) -> int:
        return sum(v.element_size() * v.nelement() for v in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# One cache per loaded network: embeddings belong to its weights, so a reloaded network starts empty.
_CACHES: weakref.WeakKeyDictionary[nn.Module, EmbeddingCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def embedding_cache(network: WarmNetwork) -> EmbeddingCache:
    with _CACHES_LOCK:
        cache = _CACHES.get(network.eager)
        if cache is None:
            cache = _CACHES[network.eager] = EmbeddingCache()
        return cache


class VistaPredictor:
    def __init__(self, network: WarmNetwork, class_bucket: int, image_key: Hashable | None = None):
        self.network = network
        self.class_bucket = class_bucket
        self.image_key = image_key
        self.embeddings = embedding_cache(network)

    def __getattr__(self, name: str) -> Any:
        # Bundle inferers look at the network they are given (`point_head.last_supported`).
        if name.startswith("__") or name in ("network", "class_bucket", "image_key", "embeddings"):
            raise AttributeError(name)
        return getattr(self.network, name)

    def __call__(self, x: torch.Tensor, *args: Any, class_vector: torch.Tensor | None = None,
                 point_coords: torch.Tensor | None = None, patch_coords=None, **kwargs: Any) -> torch.Tensor:
        if patch_coords is not None:  # the window inferer names it; the sliding window passes it second, by position
            kwargs["patch_coords"] = patch_coords
        if class_vector is not None and point_coords is None and 1 < len(class_vector) < self.class_bucket:
            return self._padded_classes(x, *args, class_vector=class_vector, **kwargs)
        if class_vector is None and point_coords is not None and patch_coords is not None and self.image_key:
            return self._with_cached_embedding(x, *args, point_coords=point_coords, **kwargs)
        return self.network(x, *args, class_vector=class_vector, point_coords=point_coords, **kwargs)

    def _padded_classes(self, x, *args, class_vector: torch.Tensor, **kwargs) -> torch.Tensor:
        n = len(class_vector)
        padded = torch.cat([class_vector, class_vector[:1].expand(self.class_bucket - n, *class_vector.shape[1:])])
        out = self.network(x, *args, class_vector=padded, **kwargs)
        # one map per class: along dim 1 when the forward transposes for an inferer ([1, classes, ...]), else dim 0
        return out[:, :n] if kwargs.get("transpose") else out[:n]

    def _with_cached_embedding(self, x, *args, **kwargs) -> torch.Tensor:
        window = tuple((s.start, s.stop) for s in kwargs["patch_coords"][0][-3:])
        key = (self.image_key, window)
        module = self.network.eager
        with RUN_LOCK:  # the embedding is state on the shared module: hand it over, run, take it back, as one step
            cached = self.embeddings.get(key)
            module.image_embeddings = cached
            try:
                out = self.network(x, *args, class_vector=None, keep_cache=True, **kwargs)
                if cached is None and module.image_embeddings is not None:
                    self.embeddings.put(key, module.image_embeddings)
            finally:
                module.image_embeddings = None
        return out
