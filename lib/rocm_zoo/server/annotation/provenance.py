"""Where a saved label came from: who saved it, with what client, when, after how much work, starting from which
model's mask at which weights version. Kept in the label's info (`GET /datastore/label/info` → `provenance`).

The server remembers, per person and image, the inferences they ran (the first one's time, how many, and the model
and checkpoint of the last one); a save by that person of that image takes them into its provenance. A client
cannot write `provenance` itself: whatever it sends under that key is replaced.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rocm_zoo.server.audit.trail import now_utc

KEY = "provenance"
MAX_REMEMBERED = 20_000  # (person, image) pairs; the least recently used forgotten first


@dataclass
class Work:
    first: float  # time.time() of the first inference
    first_utc: str
    inferences: int
    model: str
    weights: str


def person_of(actor: dict[str, Any]) -> str:
    """Who did the work: the logged-in user, or with log-in off the client's address (one person per machine)."""
    user = actor.get("user")
    return f"{user}@{actor.get('address')}" if user in (None, "(log-in off)") else str(user)


def client_kind(agent: str) -> str:
    """What the client is, from its User-Agent: OHIF runs in a browser; 3D Slicer's MONAI Label module and MONAI
    Label's Python client send python-requests' or urllib's."""
    a = agent.lower()
    if "mozilla" in a:
        return "browser (OHIF)"
    if "slicer" in a:
        return "3D Slicer"
    if "python" in a:
        return "3D Slicer or MONAI Label's client (Python)"
    return "other" if agent else "unnamed"


class WeightsVersions:
    """The checkpoint id a model's weights file serves now (`rocm-zoo models list`), "shipped" before any training
    was accepted; read again only when the weights file or the checkpoint index changed."""

    def __init__(self, bundles: Callable[[str], tuple[Path, str] | None]):
        self.bundles = bundles  # model -> (bundle folder, weights file inside it)
        self._known: dict[str, tuple[Any, str]] = {}

    def __call__(self, model: str) -> str:
        found = self.bundles(model)
        if found is None:
            return "unknown"
        from rocm_zoo.training.checkpoints import INDEX, CheckpointStore, file_stat  # here: label routes need no torch

        bundle_dir, weights = found
        store = CheckpointStore(bundle_dir, weights)
        stamp = (file_stat(store.weights), file_stat(store.folder / INDEX))
        known = self._known.get(model)
        if known is not None and known[0] == stamp:
            return known[1]
        served = store.served()
        version = served.id if served is not None else "shipped"
        self._known[model] = (stamp, version)
        return version


class WorkLog:
    def __init__(self, weights_version: Callable[[str], str]):
        self.weights_version = weights_version
        self._work: OrderedDict[tuple[str, str], Work] = OrderedDict()
        self._lock = threading.Lock()

    def inferred(self, actor: dict[str, Any], image: str, model: str) -> None:
        """After an inference on `image` by the person of `actor` answered."""
        if not image:
            return
        weights, now = self.weights_version(model), time.time()
        key = (person_of(actor), str(image))
        with self._lock:
            work = self._work.pop(key, None)
            if work is None:
                work = Work(now, now_utc(), 0, model, weights)
            work.inferences, work.model, work.weights = work.inferences + 1, model, weights
            self._work[key] = work
            while len(self._work) > MAX_REMEMBERED:
                self._work.popitem(last=False)

    def stamp(self, actor: dict[str, Any], image: str, tag: str, info: dict[str, Any]) -> dict[str, Any]:
        """`info` (a save's params) with the provenance of this save in place of any the client sent."""
        with self._lock:
            work = self._work.get((person_of(actor), str(image)))
        provenance: dict[str, Any] = {
            "user": actor.get("user"), "role": actor.get("role"), "address": actor.get("address"),
            "client": client_kind(actor.get("client") or ""), "client_agent": actor.get("client") or "",
            "saved": now_utc(), "tag": tag, "inferences": 0, "model": None, "weights": None,
            "first_inference": None, "seconds_since_first_inference": None}
        if work is not None:
            provenance.update(inferences=work.inferences, model=work.model, weights=work.weights,
                              first_inference=work.first_utc,
                              seconds_since_first_inference=round(time.time() - work.first, 1))
        return {**{k: v for k, v in info.items() if k != KEY}, KEY: provenance}

