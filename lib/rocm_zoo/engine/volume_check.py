"""Is this file a readable 3D volume, within the server's budget? Checked before a file enters the datastore or a
model, so a corrupt upload or a decompression bomb is refused with its reason instead of being stored or inflated.

A volume is judged from its HEADER first (NIfTI-1/2 and NRRD; read here, 348 to 540 bytes or the NRRD text header,
never the data): its shape and pixel type must fit the budget (`--conf max_volume_voxels`, `max_volume_gb`). Then its
data is streamed through in chunks, never held whole: it must hold every byte the header announces (a truncated file
is refused), and a compressed stream that inflates past what the header announces is refused as soon as it passes
it. A caller that must see the values (a label: finite, whole numbers) gets them chunk by chunk.

The budget's default fits a 1024x1024x2000 CT (2.1e9 voxels; 8.4 GB as float32, the widest type a model reads) with
5 % to spare; a file that announces more is refused (413) before anything is inflated.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

import numpy as np

from rocm_zoo.errors import InvalidRequest, UploadTooLarge

CHUNK_BYTES = 8 << 20
# Bytes a stream may hold past its announced data (padding some writers add); more is a bomb, refused there.
TRAILING_SLACK = 1 << 20
# Data that starts later than this in a NIfTI (extensions) or NRRD (text header) is not a volume a viewer wrote.
MAX_HEADER_BYTES = 16 << 20


@dataclass(frozen=True)
class VolumeBudget:
    """The largest volume the server reads from a client (image, label, session, DICOM series)."""

    max_voxels: int = 2_200_000_000
    max_bytes: int = 8_800_000_000

    def check(self, shape: tuple[int, ...], itemsize: int, name: str) -> None:
        voxels = int(np.prod(shape, dtype=np.float64)) if shape else 0
        if voxels > self.max_voxels:
            raise UploadTooLarge(f"'{name}' announces {'x'.join(map(str, shape))} = {voxels:.3g} voxels, over this "
                                 f"server's budget of {self.max_voxels:.3g} (--conf max_volume_voxels)")
        if voxels * itemsize > self.max_bytes:
            raise UploadTooLarge(f"'{name}' announces {voxels * itemsize / 1e9:.3g} GB of voxel data, over this "
                                 f"server's budget of {self.max_bytes / 1e9:.3g} GB (--conf max_volume_gb)")


_budget = VolumeBudget()


def set_budget(budget: VolumeBudget) -> None:
    """The server's budget, set once at start from its --conf (tests and tools keep the default)."""
    global _budget
    _budget = budget


def budget() -> VolumeBudget:
    return _budget


@dataclass(frozen=True)
class VolumeHeader:
    """What a header announces: the data's shape and on-disk type, where it starts in the (inflated) stream, the
    stream's compression, and NIfTI's value scaling."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    compression: str  # "", "gzip", "bz2"
    data_start: int = 0  # where the (compressed) data stream starts in the file: after an NRRD's text header
    slope: float = 1.0
    inter: float = 0.0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def is_volume_name(name: str) -> bool:
    return str(name).lower().endswith((".nii", ".nii.gz", ".nrrd"))


def read_header(path: str | Path, name: str) -> Optional[VolumeHeader]:
    """The header of a NIfTI or NRRD file (by the extension of `name`, else of `path`), or None for other formats;
    InvalidRequest when the header cannot be read. `name` is what messages call the file."""
    lower = (str(name) if is_volume_name(name) else str(path)).lower()
    try:
        if lower.endswith((".nii", ".nii.gz")):
            return _nifti_header(Path(path))
        if lower.endswith(".nrrd"):
            return _nrrd_header(Path(path))
    except (InvalidRequest, UploadTooLarge) as e:
        if isinstance(e, UploadTooLarge) or str(e).startswith(f"'{name}'"):
            raise
        raise InvalidRequest(f"'{name}' is not a readable volume: {e}") from e
    except Exception as e:
        raise InvalidRequest(f"'{name}' is not a readable volume: {first_line(e)}") from e
    return None


def check_volume(path: str | Path, name: str, values: Optional[Callable[[np.ndarray], None]] = None,
                 limits: Optional[VolumeBudget] = None) -> tuple[int, ...]:
    """Header, budget, then every data byte streamed through (`values` sees each chunk of voxel values); returns
    the shape, or () for formats not judged here (DICOM folders, 2D images: MONAI Label's)."""
    header = read_header(path, name)
    if header is None:
        return ()
    if len(header.shape) not in (3, 4) or min(header.shape[:3]) < 1:
        raise InvalidRequest(f"'{name}' has shape {header.shape}; a 3D volume is expected")
    if header.dtype.kind not in "iubf":
        raise InvalidRequest(f"'{name}' has voxel type {header.dtype}; numbers are expected")
    (limits or _budget).check(header.shape, header.dtype.itemsize, name)
    for chunk in stream_values(path, header, name):
        if values is not None:
            values(chunk)
    return header.shape


def check_dicom_budget(what: str, headers) -> None:
    """DICOM images (their headers: pydicom datasets) as one volume: rows x columns x frames, an upper bound when
    sizes differ, within the budget as float32 (what they are converted to and read as); UploadTooLarge if not."""
    rows = max((int(h.get("Rows", 0) or 0) for h in headers), default=0)
    columns = max((int(h.get("Columns", 0) or 0) for h in headers), default=0)
    frames = sum(int(h.get("NumberOfFrames", 1) or 1) for h in headers)
    _budget.check((columns, rows, frames), 4, what)


def stream_values(path: str | Path, header: VolumeHeader, name: str) -> Iterator[np.ndarray]:
    """The voxel values, chunk by chunk (scaled as the header says); InvalidRequest for a stream that ends before
    its announced data, or goes on past it."""
    item = header.dtype.itemsize
    chunk_bytes = max(item, CHUNK_BYTES // item * item)
    scaled = header.slope != 1.0 or header.inter != 0.0
    with open(path, "rb") as raw:
        raw.seek(header.data_start)
        stream = _decompressed(raw, header.compression)
        try:
            _skip(stream, header.offset, name)
            left = header.nbytes
            while left:
                block = _read_full(stream, min(chunk_bytes, left))
                if len(block) < min(chunk_bytes, left):
                    raise InvalidRequest(f"'{name}' is truncated: its data ends {left - len(block)} bytes before "
                                         "what its header announces")
                left -= len(block)
                values = np.frombuffer(block, dtype=header.dtype)
                yield values * header.slope + header.inter if scaled else values
            extra = _read_full(stream, TRAILING_SLACK + 1)
            if len(extra) > TRAILING_SLACK:
                raise InvalidRequest(f"'{name}' inflates past the {header.nbytes} bytes of data its header announces "
                                     "(a decompression bomb?); refused")
        except InvalidRequest:
            raise
        except (EOFError, OSError, zlib.error, ValueError) as e:
            raise InvalidRequest(f"'{name}' is not a readable volume: {first_line(e)}") from e


def first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- formats ---------------------------------------------------------------------------------------------------------

def _decompressed(raw: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    return raw


def _read_full(stream: BinaryIO, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = stream.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _skip(stream: BinaryIO, n: int, name: str) -> None:
    while n > 0:
        part = stream.read(min(n, CHUNK_BYTES))
        if not part:
            raise InvalidRequest(f"'{name}' is truncated: it ends inside its header")
        n -= len(part)


def _nifti_header(path: Path) -> VolumeHeader:
    import nibabel as nib

    with open(path, "rb") as raw:
        compression = "gzip" if raw.read(2) == b"\x1f\x8b" else ""
        raw.seek(0)
        block = _read_full(_decompressed(raw, compression), 540)
    if len(block) < 348:
        raise InvalidRequest("the file ends inside its NIfTI header")
    sizes = {int.from_bytes(block[:4], "little"), int.from_bytes(block[:4], "big")}
    if 540 in sizes and len(block) >= 540:
        header = nib.Nifti2Header(block[:540], check=False)
    elif 348 in sizes:
        header = nib.Nifti1Header(block[:348], check=False)
    else:
        raise InvalidRequest("not a NIfTI file (its header size is neither 348 nor 540)")
    if not bytes(header["magic"].item()).startswith((b"n+1", b"n+2")):
        raise InvalidRequest("not a single-file NIfTI (.nii / .nii.gz)")
    shape = tuple(int(s) for s in header.get_data_shape())
    offset = int(header.get_data_offset())
    if offset > MAX_HEADER_BYTES:
        raise InvalidRequest(f"its data starts {offset} bytes in (header extensions over {MAX_HEADER_BYTES})")
    slope, inter = header.get_slope_inter()
    slope = 1.0 if slope is None or not np.isfinite(slope) else float(slope)
    inter = 0.0 if inter is None or not np.isfinite(inter) else float(inter)
    return VolumeHeader(shape, np.dtype(header.get_data_dtype()), offset, compression, 0, slope, inter)


def _nrrd_header(path: Path) -> VolumeHeader:
    import nrrd
    from nrrd.reader import _determine_datatype

    lines = []
    with open(path, "rb") as raw:
        while True:
            line = raw.readline(MAX_HEADER_BYTES)
            if not line or raw.tell() > MAX_HEADER_BYTES:
                raise InvalidRequest("the file ends inside its NRRD header")
            if line in (b"\n", b"\r\n"):
                break
            lines.append(line.decode("ascii", errors="replace").rstrip("\r\n"))
        data_start = raw.tell()
    header = nrrd.read_header(lines)
    if header.get("datafile", header.get("data file")):
        raise InvalidRequest("a detached NRRD (its data in another file) is not accepted; send one .nrrd file")
    if header.get("lineskip", header.get("line skip", 0)) or header.get("byteskip", header.get("byte skip", 0)):
        raise InvalidRequest("NRRD 'line skip' / 'byte skip' is not accepted")
    encoding = str(header.get("encoding", "raw")).lower()
    compression = {"raw": "", "gzip": "gzip", "gz": "gzip", "bzip2": "bz2", "bz2": "bz2"}.get(encoding)
    if compression is None:
        raise InvalidRequest(f"NRRD encoding '{encoding}' is not accepted (raw, gzip or bzip2)")
    shape = tuple(int(s) for s in header["sizes"])
    return VolumeHeader(shape, np.dtype(_determine_datatype(header)), 0, compression, data_start)


def integral_label_values(name: str) -> Callable[[np.ndarray], None]:
    """A `values` check for a label: finite whole numbers, 0 (background) or more."""
    def check(values: np.ndarray) -> None:
        if values.dtype.kind == "f":
            if not np.isfinite(values).all():
                raise InvalidRequest(f"The {name} holds NaN or infinite values: labels are whole numbers "
                                     "(0 background)")
            if not np.array_equal(values, np.round(values)):
                raise InvalidRequest(f"The {name} holds non-integer values: labels are whole numbers (0 background)")
        elif values.dtype.kind not in "iub":
            raise InvalidRequest(f"The {name} has pixel type {values.dtype}; labels are whole numbers")
        if values.size and values.min() < 0:
            raise InvalidRequest(f"The {name} holds negative values: labels are 0 (background) or more")

    return check

