"""Every accepted checkpoint of a bundle, kept for rollback, and which one the bundle's weights file serves.

Under `<bundle>/models/checkpoints/`: one file per checkpoint, in the format of the bundle's weights file (a plain
state dict, or `{"model": state_dict}` where the served file had that wrapping), and `index.json`: each checkpoint's
id, file, creation time (UTC), validation score (mean Dice) and what it was measured on, source ("shipped",
"training", "rollback"), epochs and number of labelled images trained on, and the id served.

Serving a checkpoint is four atomic steps: its file; the index naming it as the one being served; the bundle's
weights file; the index naming it served. A crash leaves the weights file old or new, and the next reader of the index
settles which by the file's SHA-256 (a checkpoint whose serving did not finish is dropped, as if never made). The
pool reloads (or is given, in place) what the weights file holds; this module only writes files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from rocm_zoo.engine.atomic_files import atomic_copy, atomic_torch_save, atomic_write_text
from rocm_zoo.engine.overlay import is_wrapped, read_state_dict, unwrap_state_dict
from rocm_zoo.engine.pool import check_state_dict
from rocm_zoo.errors import BundleNotFound, CheckpointNotFound

FOLDER = Path("models") / "checkpoints"
INDEX = "index.json"
SHIPPED = "shipped"
SOURCES = ("shipped", "training", "rollback")


@dataclass(frozen=True)
class TrainingDetails:
    """What a training run's checkpoint comes with, besides its score."""

    measured_on: str  # what the validation score was measured on, e.g. "4 validation images (labels/final)"
    epochs: int
    labels: int  # labelled images trained on


@dataclass(frozen=True)
class Checkpoint:
    id: str
    file: str  # inside the checkpoints folder; a rollback shares its target's file
    created: str  # UTC, ISO 8601
    source: str  # one of SOURCES
    sha256: str
    score: float | None = None  # mean Dice on `measured_on`; None for the shipped weights (not measured here)
    measured_on: str | None = None
    epochs: int | None = None
    labels: int | None = None
    rollback_of: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Checkpoint:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


class CheckpointStore:
    def __init__(self, bundle_dir: Path, weights_rel: str = "models/model.pt"):
        self.bundle_dir = Path(bundle_dir)
        self.weights = self.bundle_dir / weights_rel
        self.folder = self.bundle_dir / FOLDER
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.bundle_dir.name

    # -- reading -------------------------------------------------------------------------------------------------------
    def list(self) -> list[Checkpoint]:
        """Oldest first."""
        return self._read()[1]

    def served(self) -> Checkpoint | None:
        """The checkpoint the weights file holds; None before any was accepted, or when the file was replaced by
        something else than this store (its content matches no checkpoint)."""
        served_id, checkpoints = self._read()
        return next((c for c in checkpoints if c.id == served_id), None)

    def served_score(self) -> float | None:
        served = self.served()
        return None if served is None else served.score

    def path(self, checkpoint: Checkpoint) -> Path:
        return self.folder / checkpoint.file

    # -- writing -------------------------------------------------------------------------------------------------------
    def accept(self, state_dict: Mapping[str, torch.Tensor], score: float, details: TrainingDetails) -> Checkpoint:
        """Keep `state_dict` as a new checkpoint and serve it. The first time (or after the weights file was replaced
        from outside) the weights served until now are kept first, as "shipped" (copied, never moved). The state dict
        must fit the served weights (same keys and shapes)."""
        if not self.weights.is_file():
            raise BundleNotFound(f"{self.name}: no weights file {self.weights} to replace")
        state = {k: v.detach().cpu() for k, v in unwrap_state_dict(state_dict).items()}
        check_state_dict(state, read_state_dict(self.weights, mmap=True), self.name)
        with self._locked():
            served_id, checkpoints = self._read()
            if served_id is None:
                checkpoints.append(self._keep_served_file(checkpoints))
            new_id = str(1 + max((int(c.id) for c in checkpoints if c.id.isdigit()), default=0))
            wrapped = is_wrapped(torch.load(self.weights, map_location="cpu", weights_only=True, mmap=True))
            file = f"{new_id}.pt"
            atomic_torch_save(self.folder / file, {"model": state} if wrapped else state)
            checkpoint = Checkpoint(new_id, file, _now(), "training", _sha256(self.folder / file), float(score),
                                    details.measured_on, int(details.epochs), int(details.labels))
            return self._serve(checkpoint, checkpoints, served_id or checkpoints[-1].id)

    def rollback(self, checkpoint_id: str) -> Checkpoint:
        """Serve a kept checkpoint again; recorded as a new "rollback" entry (the history stays in order) sharing the
        target's file. Returns that entry (its score is the target's)."""
        with self._locked():
            served_id, checkpoints = self._read()
            target = next((c for c in checkpoints if c.id == str(checkpoint_id)), None)
            if target is None:
                kept = ", ".join(c.id for c in checkpoints) or "none (no weights were accepted yet)"
                raise CheckpointNotFound(f"{self.name} has no checkpoint '{checkpoint_id}'; kept: {kept}")
            if not self.path(target).is_file():
                raise CheckpointNotFound(f"{self.name}: the file of checkpoint '{target.id}' is missing "
                                         f"({self.path(target)})")
            new_id = str(1 + max((int(c.id) for c in checkpoints if c.id.isdigit()), default=0))
            entry = replace(target, id=new_id, created=_now(), source="rollback", rollback_of=target.id)
            return self._serve(entry, checkpoints, served_id)

    def _serve(self, checkpoint: Checkpoint, checkpoints: list[Checkpoint], served_id: str | None) -> Checkpoint:
        checkpoints = checkpoints + [checkpoint]
        self._write_index(served_id, checkpoints, serving=checkpoint.id)
        atomic_copy(self.path(checkpoint), self.weights)
        self._write_index(checkpoint.id, checkpoints)
        return checkpoint

    def _keep_served_file(self, checkpoints: list[Checkpoint]) -> Checkpoint:
        taken = {c.id for c in checkpoints}
        n = 1
        new_id = SHIPPED
        while new_id in taken:
            n += 1
            new_id = f"{SHIPPED}-{n}"
        file = f"{new_id}{self.weights.suffix}"
        atomic_copy(self.weights, self.folder / file)
        return Checkpoint(new_id, file, _now(), "shipped", _sha256(self.folder / file))

    # -- the index -----------------------------------------------------------------------------------------------------
    def _read(self) -> tuple[str | None, list[Checkpoint]]:
        """(served id, checkpoints), with an interrupted serving settled by the weights file's content."""
        index = self.folder / INDEX
        if not index.is_file():
            return None, []
        raw = json.loads(index.read_text())
        checkpoints = [Checkpoint.from_dict(c) for c in raw.get("checkpoints", [])]
        served_id, serving = raw.get("served"), raw.get("serving")
        stat = file_stat(self.weights)
        if serving is None and stat == raw.get("weights_stat"):
            return served_id, checkpoints
        digest = _sha256(self.weights) if self.weights.is_file() else None
        if serving is not None:
            pending = next(c for c in checkpoints if c.id == serving)
            if digest == pending.sha256:
                served_id = serving
            else:
                checkpoints.remove(pending)
        if next((c.sha256 for c in checkpoints if c.id == served_id), None) != digest:
            served_id = None  # replaced from outside the store: no checkpoint holds what is served
        return served_id, checkpoints

    def _write_index(self, served_id: str | None, checkpoints: list[Checkpoint], serving: str | None = None) -> None:
        raw = {"weights": str(self.weights.relative_to(self.bundle_dir)), "served": served_id, "serving": serving,
               "weights_stat": file_stat(self.weights), "checkpoints": [asdict(c) for c in checkpoints]}
        atomic_write_text(self.folder / INDEX, json.dumps(raw, indent=2) + "\n")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time, in this process (threads) and across processes (the CLI beside a server)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def file_stat(path: Path) -> list[int] | None:
    """[size, mtime_ns] of a file, None where there is none: enough to tell that it changed without reading it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
