"""The audit trail: an append-only, hash-chained JSON-lines file of who did what to the server's data and models.

One line per event (log-ins and failed log-ins, label saves, deletions, dataset exports, trainings, weight swaps and
rollbacks, user changes, the configuration at start). Each entry carries its sequence number, the previous entry's
hash and its own: SHA-256 over the previous hash and the entry's canonical JSON. A head file beside the log names the
last entry, so `verify` finds an edited, removed, inserted or reordered entry, and lost entries at the end.

The server and `rocm-zoo` commands write to the same file: each append holds an exclusive `flock` on the log, so
entries from several processes stay in one chain. What the chain cannot stop is someone with the server account's
write access rebuilding the whole chain; a site that needs that ships the log off the machine as it grows (each
entry's hash is also in the server log at DEBUG).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator

from rocm_zoo.engine.atomic_files import atomic_write_text

logger = logging.getLogger(__name__)

GENESIS = "0" * 64  # the `prev` of the first entry
FILE = Path("logs") / "audit.jsonl"  # inside the app folder (its logs folder: 0700, files 0600)
HEAD_SUFFIX = ".head"


def trail_path(app_dir: str | Path) -> Path:
    return Path(app_dir) / FILE


def process_actor(client: str) -> dict[str, Any]:
    """The actor of an entry this machine's processes write: the server itself, its trainings, or a `rocm-zoo`
    command (then the operating-system account that ran it)."""
    import getpass

    user = None
    if client.startswith("rocm-zoo"):
        try:
            user = f"os:{getpass.getuser()}"
        except (KeyError, OSError):
            user = f"os:uid {os.getuid()}"
    return {"user": user, "role": None, "address": "local", "client": client}


def entry_hash(entry: dict[str, Any]) -> str:
    """SHA-256 over the previous hash and the entry without its own hash, as canonical JSON."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((str(entry.get("prev", "")) + canonical).encode()).hexdigest()


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Verdict:
    entries: int = 0
    last_hash: str = GENESIS
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"intact": self.intact, "entries": self.entries, "last_hash": self.last_hash,
                "problems": list(self.problems)}


class AuditTrail:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.head = self.path.with_name(self.path.name + HEAD_SUFFIX)
        self._lock = threading.Lock()  # flock is per open file: threads of one process also take this

    # -- writing -------------------------------------------------------------------------------------------------------
    def record(self, event: str, actor: dict[str, Any], **details: Any) -> dict[str, Any]:
        """Append one entry and return it. `actor`: who (user, role, address, client); `details`: what, as JSON."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._lock, open(self.path, "a+b") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            try:
                seq, prev, torn = self._tail(log)
                entry = {"seq": seq + 1, "time": now_utc(), "event": event, "actor": _plain(actor),
                         "details": _plain(details), "prev": prev}
                entry["hash"] = entry_hash(entry)
                log.seek(0, os.SEEK_END)
                line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"
                log.write((("\n" if torn else "") + line).encode())
                log.flush()
                os.fsync(log.fileno())
                atomic_write_text(self.head, json.dumps({"seq": entry["seq"], "hash": entry["hash"]}) + "\n")
            finally:
                fcntl.flock(log, fcntl.LOCK_UN)
        os.chmod(self.path, 0o600)
        logger.debug("audit: %s #%d %s", event, entry["seq"], entry["hash"])
        return entry

    def _tail(self, log) -> tuple[int, str, bool]:
        """The last whole entry's sequence number and hash, and whether the log lacks its final newline (a crash
        tore the last line: the next entry starts on a line of its own, and verify reports the torn one)."""
        size = log.seek(0, os.SEEK_END)
        if size == 0:
            return 0, GENESIS, False
        back = min(size, 1 << 16)
        log.seek(size - back)
        tail = log.read(back)
        for line in reversed(tail.split(b"\n")):
            try:
                last = json.loads(line)
                return int(last["seq"]), str(last["hash"]), not tail.endswith(b"\n")
            except (ValueError, KeyError, TypeError):
                continue
        head = self._read_head()  # no whole entry in the last 64 KiB
        return (head["seq"], head["hash"], True) if head else (0, GENESIS, True)

    def _read_head(self) -> dict[str, Any] | None:
        try:
            head = json.loads(self.head.read_text())
            return {"seq": int(head["seq"]), "hash": str(head["hash"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # -- reading -------------------------------------------------------------------------------------------------------
    def entries(self, user: str | None = None, image: str | None = None, since: str | None = None,
                event: str | None = None) -> Iterator[dict[str, Any]]:
        """Entries in order; `since` is an ISO date or time (UTC), `image` matches any detail naming that image."""
        for _, entry in self._lines():
            if not isinstance(entry, dict):
                continue
            if user and (entry.get("actor") or {}).get("user") != user:
                continue
            if image and image not in _images_of(entry.get("details") or {}):
                continue
            if since and str(entry.get("time", "")) < since:
                continue
            if event and not str(entry.get("event", "")).startswith(event):
                continue
            yield entry

    def verify(self) -> Verdict:
        """The chain and the head file as of one moment: read under a shared lock, so an append in progress (its
        line written, the head file not yet) is not taken for lost entries."""
        verdict, prev = Verdict(), GENESIS
        with self._read_locked() as log:
            head = self._read_head()
            for number, entry in _parsed(log):
                if not isinstance(entry, dict):
                    verdict.problems.append(f"line {number} is not a JSON entry")
                    continue
                seq = entry.get("seq")
                if seq != verdict.entries + 1:
                    verdict.problems.append(f"line {number}: entry #{seq} where #{verdict.entries + 1} was expected "
                                            "(an entry was removed, inserted or moved)")
                if entry.get("prev") != prev:
                    verdict.problems.append(f"line {number} (entry #{seq}): does not follow the entry before it")
                if entry_hash(entry) != entry.get("hash"):
                    verdict.problems.append(f"line {number} (entry #{seq}): its content does not match its hash "
                                            "(edited)")
                prev = str(entry.get("hash"))
                verdict.entries += 1
                verdict.last_hash = prev
        if head is None:
            if verdict.entries:
                verdict.problems.append(f"the head file {self.head.name} is missing or unreadable: the end of the log "
                                        "cannot be checked")
        elif head["seq"] != verdict.entries or head["hash"] != verdict.last_hash:
            verdict.problems.append(f"the log ends at entry #{verdict.entries}, the head file names entry "
                                    f"#{head['seq']}: entries at the end were removed or changed")
        return verdict

    def _lines(self) -> Iterator[tuple[int, Any]]:
        with self._read_locked() as log:
            yield from _parsed(log)

    @contextmanager
    def _read_locked(self) -> Iterator[IO[bytes]]:
        """The log (empty when there is none yet) under a shared lock: no append is half done while it is held."""
        try:
            log = open(self.path, "rb")
        except FileNotFoundError:
            yield io.BytesIO()
            return
        with log:
            fcntl.flock(log, fcntl.LOCK_SH)
            try:
                yield log
            finally:
                fcntl.flock(log, fcntl.LOCK_UN)


def _parsed(log: IO[bytes]) -> Iterator[tuple[int, Any]]:
    for number, raw in enumerate(log, start=1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except ValueError:
            yield number, None


def _images_of(details: dict[str, Any]) -> set[str]:
    return {str(details[k]) for k in ("image", "id", "label") if details.get(k) is not None}


def _plain(value: Any) -> Any:
    """JSON-safe and bounded: long strings cut, unknown objects as text."""
    if isinstance(value, dict):
        return {str(k)[:64]: _plain(v) for k, v in list(value.items())[:64]}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in list(value)[:256]]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)[:500]
