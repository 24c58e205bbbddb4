"""What VISTA3D's inferer calls instead of the warm network: fixed class-head shapes, and the image encoder's output
kept per (image, window) for clicks.

Class prompts: the class head is compiled for a fixed number of classes, and the number a client asks for varies
(one organ, a handful, OHIF's all-but-a-few, the 117 of "everything"). Prompts of more than one class are padded to
`class_bucket` (repeats of the first class; the head embeds each class on its own, so padding changes nothing) and the
padded maps are dropped again before stitching. Two class-head shapes then serve every prompt: 1 and the bucket.

Clicks run only the windows around them, and a clinician clicks again and again on one image. The image encoder's
output for a window depends on the image and the window alone, so it is kept per (image, window, encoder branches),
bounded in bytes, and a later click that needs that window skips the encoder. VISTA3D's own reuse hook
(`image_embeddings` with `keep_cache=True`) serves clicks without a class only; the encoder is therefore wrapped
(`CachingEncoder`, put on the pooled module once by `rocm_zoo.vista3d.install`), which serves clicks with a class
(OHIF's) as well. Whole-volume prompts are not cached: they touch every window once and would push the clicked windows
out.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Hashable

import torch
from torch import nn

from rocm_zoo.engine import streams
from rocm_zoo.engine.lru import ByteLRU
from rocm_zoo.engine.pool import WarmNetwork
from rocm_zoo.engine.scheduler import device_turn

# A full-size VISTA3D point-branch embedding of one 128^3 window is 48 x 128^3 values: 201 MB in bf16, so this keeps
# the last ten windows (a session of ten clicks on one image); the tiny sample's are 4 MB.
EMBEDDING_CACHE_BYTES = 2 * 2**30


class EmbeddingCache:
    """Least recently used encoder outputs (tensors, or tuples of tensors and None), bounded in bytes; the newest
    entry is always kept."""

    def __init__(self, max_bytes: int = EMBEDDING_CACHE_BYTES):
        self._entries: ByteLRU[Hashable, Any] = ByteLRU(max_bytes, _nbytes)
        self._count_lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def get(self, key: Hashable) -> Any:
        kept = self._entries.get(key)
        with self._count_lock:
            if kept is None:
                self.misses += 1
            else:
                self.hits += 1
        if kept is None:
            return None
        value, made = kept
        streams.use_here(value, made)  # made by a click or a warm-up, on its stream (engine.streams)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        self._entries.put(key, (value, streams.ready(value)))

    def size_bytes(self) -> int:
        return self._entries.size_bytes()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def _nbytes(value: Any) -> int:
    if isinstance(value, (tuple, list)):  # (encoder output, event); an encoder output: (point branch, label branch)
        return sum(_nbytes(v) for v in value)
    return value.element_size() * value.nelement() if torch.is_tensor(value) else 0


def _detached(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value.detach() if torch.is_tensor(value) else value


class CachingEncoder(nn.Module):
    """Stands in for VISTA3D's `image_encoder`: while `key` names an (image, window), the encoder's output for it
    comes from the cache when it is there, and goes into it when it is not. With no key it is the encoder itself."""

    def __init__(self, encoder: nn.Module, cache: EmbeddingCache):
        super().__init__()
        self.encoder = encoder
        self.cache = cache
        # Per thread: clicks of two clients may run this module at once, each on its own stream (engine.streams).
        self._keys: dict[int, Hashable] = {}

    @property
    def key(self) -> Hashable | None:
        return self._keys.get(threading.get_ident())

    @key.setter
    def key(self, value: Hashable | None) -> None:
        if value is None:
            self._keys.pop(threading.get_ident(), None)
        else:
            self._keys[threading.get_ident()] = value

    def forward(self, input_images: torch.Tensor, with_point: bool = True, with_label: bool = True):
        key = None if self.key is None else (self.key, with_point, with_label)
        if key is not None:
            cached = self.cache.get(key)
            if cached is not None:
                return cached
        out = self.encoder(input_images, with_point=with_point, with_label=with_label)
        if key is not None:
            self.cache.put(key, _detached(out))
        return out


# One cache per loaded network: embeddings belong to its weights, so a reloaded network starts empty and one whose
# weights were swapped in place is emptied (while requests wait for the swap).
_CACHES: weakref.WeakKeyDictionary[nn.Module, EmbeddingCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def embedding_cache(network: WarmNetwork) -> EmbeddingCache:
    with _CACHES_LOCK:
        cache = _CACHES.get(network.eager)
        if cache is None:
            cache = _CACHES[network.eager] = EmbeddingCache()
            network.after_swap(cache.clear)
        return cache


def route_encoder(network: WarmNetwork) -> CachingEncoder:
    """The pooled module's encoder, wrapped once (the compiled encoder stays inside, warm)."""
    module = network.eager
    cache = embedding_cache(network)
    with _CACHES_LOCK:
        if not isinstance(module.image_encoder, CachingEncoder):
            module.image_encoder = CachingEncoder(module.image_encoder, cache)
        return module.image_encoder


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
        if point_coords is not None and patch_coords is not None and self.image_key:
            return self._with_cached_encoder(x, *args, class_vector=class_vector, point_coords=point_coords, **kwargs)
        return self.network(x, *args, class_vector=class_vector, point_coords=point_coords, **kwargs)

    def _padded_classes(self, x, *args, class_vector: torch.Tensor, **kwargs) -> torch.Tensor:
        n = len(class_vector)
        padded = torch.cat([class_vector, class_vector[:1].expand(self.class_bucket - n, *class_vector.shape[1:])])
        out = self.network(x, *args, class_vector=padded, **kwargs)
        # one map per class: along dim 1 when the forward transposes for an inferer ([1, classes, ...]), else dim 0
        return out[:, :n] if kwargs.get("transpose") else out[:n]

    def _with_cached_encoder(self, x, *args, **kwargs) -> torch.Tensor:
        window = tuple((s.start, s.stop) for s in kwargs["patch_coords"][0][-3:])
        encoder = self.network.eager.image_encoder
        if not isinstance(encoder, CachingEncoder):
            raise RuntimeError("VISTA3D's encoder is not routed to the embedding cache on this network: call "
                               "rocm_zoo.vista3d.install(network, inferer) before the predictor runs")
        # The key is this thread's state on the shared module: set it, run, clear it, in one turn on the device.
        with device_turn(self.network.backend.device):
            encoder.key = (self.image_key, window)
            try:
                return self.network(x, *args, **kwargs)
            finally:
                encoder.key = None
