"""Files that are either old or new, never torn: written to a temporary file beside the destination, flushed and
fsynced, renamed over it, and the folder fsynced so the rename itself survives a power cut.

The one writer for the server's datastore (images, labels, its index), the PACS store's pending labels, weights and
checkpoints (the training package), the record of what a model was trained on, the users file and the sample bundles;
at the engine's level so that none of them needs the server.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

PARTIAL = ".partial-"  # temporary files are .<name>.partial-XXXX beside their destination: a crash may leave one
TEST_PAUSE_WRITE = "ROCM_ZOO_TEST_PAUSE_WRITE"  # test hook only: see _paused_for_test


def atomic_copy(src: Path, dest: Path) -> None:
    def copy(out: IO[bytes]) -> None:
        with open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)

    atomic_write(dest, copy)


def atomic_write_text(dest: Path, text: str) -> None:
    atomic_write(dest, lambda out: out.write(text.encode()))


def atomic_torch_save(dest: Path, obj: object) -> None:
    import torch  # here: the module's other writers (the users file, `rocm-zoo users`) need no torch

    atomic_write(dest, lambda out: torch.save(obj, out))


def atomic_write(dest: Path, write: Callable[[IO[bytes]], object], mode: int | None = None) -> None:
    """`write(file)` into a temporary binary file beside dest, flushed and fsynced, then renamed over dest. The file
    keeps mkstemp's 0600 unless `mode` says otherwise."""
    folder = Path(dest).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(dest).name}{PARTIAL}", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            out.flush()
            os.fsync(out.fileno())
        _paused_for_test(dest, tmp)
        os.replace(tmp, dest)
        fsync_folder(folder)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _paused_for_test(dest: Path, tmp: str) -> None:
    """Test hook, inert unless the environment variable ROCM_ZOO_TEST_PAUSE_WRITE names a marker file: while
    `<marker>.arm` exists and its text (an fnmatch pattern, empty for any) matches `dest`, a write whose temporary file
    is complete writes that file's path to the marker and waits there, before the rename, until the arm file is
    removed. tests/server/test_server_crash.py kills the server at that point, so the kill provably lands mid-write."""
    marker = os.environ.get(TEST_PAUSE_WRITE)
    if not marker:
        return
    arm = Path(marker + ".arm")
    try:
        pattern = arm.read_text().strip()
    except OSError:
        return
    if pattern and not fnmatch.fnmatch(str(dest), pattern):
        return
    # Written then renamed: the test polls for the marker and must never read it empty.
    Path(marker + ".writing").write_text(tmp)
    os.replace(marker + ".writing", marker)
    while arm.exists():
        time.sleep(0.05)


def fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot fsync a folder; the rename is still atomic there
        pass
    finally:
        os.close(fd)
