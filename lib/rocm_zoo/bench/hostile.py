"""What a hostile or broken client sends, as bytes: for `rocm-zoo bench-load --hostile` (a soak with attacks mixed in)
and the security tests. No Locust here, so the tests and the parent process can import it.

Each payload is small on the wire and bounded in what it asks of the server if a defence is missing: an archive whose
members climb out of the folder it is unpacked into, and NIfTI labels that inflate far beyond their size (a header
announcing a volume over any budget; a header with the image's shape whose gzip stream goes on inflating).
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib

import numpy as np

GZIP_CHUNK = 1 << 20


def slip_tar(escape: str = "../rocm-zoo-slip.txt") -> bytes:
    """A tar archive with one harmless member and one named to land outside the folder it is unpacked into
    (`escape`: `../x`, an absolute path)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (("image.txt", b"harmless"), (escape, b"written outside the session folder")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def nifti_header(shape: tuple[int, ...], dtype=np.uint8, spacing: tuple[float, ...] = (1.0, 1.0, 1.0)) -> bytes:
    """A single-file NIfTI-1 header (with its 4-byte extension flag) announcing `shape` of `dtype`."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(dtype)
    header.set_zooms(tuple(spacing)[: len(shape)])
    header["vox_offset"] = 352
    return header.binaryblock + b"\x00" * 4


def bomb_nifti_gz(shape: tuple[int, ...], inflated_bytes: int, dtype=np.uint8,
                  spacing: tuple[float, ...] = (1.0, 1.0, 1.0)) -> bytes:
    """A `.nii.gz` whose header announces `shape` and whose gzip stream inflates to `inflated_bytes` of zeros after it:
    about 1/1000 of that on the wire. With a huge `shape` it is a header over every budget; with the image's shape and
    `inflated_bytes` beyond it, a stream that goes on after the volume it announced."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    parts = [compressor.compress(nifti_header(shape, dtype, spacing))]
    zeros = bytes(GZIP_CHUNK)
    left = int(inflated_bytes)
    while left > 0:
        parts.append(compressor.compress(zeros[: min(left, GZIP_CHUNK)]))
        left -= GZIP_CHUNK
    parts.append(compressor.flush())
    return b"".join(parts)


def inflated_size(data: bytes) -> int:
    """Bytes a gzip payload inflates to (read in chunks: for checking a payload, not for a server)."""
    total = 0
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
        while chunk := f.read(GZIP_CHUNK):
            total += len(chunk)
    return total
