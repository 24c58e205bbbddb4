"""Unpacking an archive a client sent, without letting it write outside its folder or fill the disk.

`shutil.unpack_archive` (what MONAI Label's sessions use) writes a member named `../../x` or `/x` there, follows
links and inflates whatever the archive holds. `extract` takes only regular files, each resolved inside the target
folder (no `..`, no absolute names, no links, devices or FIFOs), at most `max_members` of them and at most
`max_bytes` inflated in all, and at most `max_ratio` times the archive's own size (beyond `ratio_floor`): a study's
files compress a few times, a bomb a thousand, so a bomb stops at a small multiple of what was uploaded instead of
filling the disk. Sizes are counted while the data is written, not taken from the member headers, so an archive that
lies about its sizes is stopped as soon as it passes the cap. A refused archive leaves nothing behind: the target
folder is removed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from rocm_zoo.errors import InvalidRequest, UploadTooLarge

CHUNK = 1 << 20


@dataclass(frozen=True)
class ArchiveLimits:
    """What one uploaded archive may hold. The defaults fit a CT series of 4,000 DICOM slices, or one volume of the
    default voxel budget as float32 (engine.volume_check)."""

    max_members: int = 10_000
    max_bytes: int = 9 * 2**30
    max_ratio: float = 100.0
    ratio_floor: int = 64 * 2**20


def is_archive(path: str | Path) -> bool:
    return zipfile.is_zipfile(path) or tarfile.is_tarfile(path)


def extract(archive: str | Path, target: str | Path, limits: ArchiveLimits = ArchiveLimits()) -> list[Path]:
    """Extracts `archive` (zip or tar, compressed or not) into the new folder `target`; returns the files written.
    InvalidRequest (422) for a member that is not a plain file inside the folder, UploadTooLarge (413) past a cap."""
    target = Path(target)
    size = os.path.getsize(archive)
    limits = replace(limits, max_bytes=min(limits.max_bytes, max(limits.ratio_floor, int(limits.max_ratio * size))))
    target.mkdir(parents=True, exist_ok=False)
    try:
        if zipfile.is_zipfile(archive):
            return _extract_zip(Path(archive), target, limits)
        if tarfile.is_tarfile(archive):
            return _extract_tar(Path(archive), target, limits)
        raise InvalidRequest("The upload is not an archive this server unpacks (zip or tar, optionally gz/bz2/xz)")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def member_path(target: Path, name: str) -> Path:
    """Where member `name` goes under `target`, or InvalidRequest if that is not strictly inside it."""
    shown = name if len(name) <= 120 else name[:117] + "..."
    pure = PurePosixPath(name.replace("\\", "/"))
    if not name or "\x00" in name or pure.is_absolute() or name.startswith(("/", "\\")) or ".." in pure.parts \
            or (pure.parts and ":" in pure.parts[0]):
        raise InvalidRequest(f"The archive's member '{shown}' points outside its folder (absolute or '..'); "
                             "nothing was unpacked")
    path = (target / Path(*pure.parts)).resolve() if pure.parts else target
    root = target.resolve()
    if path == root or root not in path.parents:
        raise InvalidRequest(f"The archive's member '{shown}' points outside its folder; nothing was unpacked")
    return path


class _Budget:
    def __init__(self, limits: ArchiveLimits):
        self.limits = limits
        self.members = 0
        self.bytes = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise UploadTooLarge(f"The archive holds more than {self.limits.max_members} members; nothing was unpacked")

    def copy(self, source, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            raise InvalidRequest(f"The archive holds '{path.name}' twice; nothing was unpacked")
        with open(path, "xb") as out:
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                self.bytes += len(chunk)
                if self.bytes > self.limits.max_bytes:
                    raise UploadTooLarge(f"The archive inflates to more than {self.limits.max_bytes / 2**20:.0f} MiB "
                                         "(at most 9 GiB, and 100 times its own size); nothing was unpacked")
                out.write(chunk)


def _extract_zip(archive: Path, target: Path, limits: ArchiveLimits) -> list[Path]:
    budget, written = _Budget(limits), []
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            budget.member()
            if info.is_dir():
                member_path(target, info.filename.rstrip("/") or "/")
                continue
            path = member_path(target, info.filename)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type stored (a plain file)
            if kind and kind != stat.S_IFREG:
                raise InvalidRequest(f"The archive's member '{info.filename[:120]}' is not a regular file (a link, "
                                     "device or FIFO); nothing was unpacked")
            with z.open(info) as source:
                budget.copy(source, path)
            written.append(path)
    return written


def _extract_tar(archive: Path, target: Path, limits: ArchiveLimits) -> list[Path]:
    budget, written = _Budget(limits), []
    with tarfile.open(archive, mode="r:*") as tar:
        for info in tar:  # members are read one by one, counted before the next is read
            budget.member()
            if info.isdir():
                member_path(target, info.name.rstrip("/") or "/")
                continue
            if not info.isreg():
                raise InvalidRequest(f"The archive's member '{info.name[:120]}' is not a regular file (a link, device "
                                     "or FIFO); nothing was unpacked")
            path = member_path(target, info.name)
            source = tar.extractfile(info)
            if source is None:
                raise InvalidRequest(f"The archive's member '{info.name[:120]}' cannot be read")
            with source:
                budget.copy(source, path)
            written.append(path)
    return written


def remove(path: str | os.PathLike) -> None:
    """A file or folder, gone (a refused upload's leftovers)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
