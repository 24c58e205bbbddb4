"""MONAI Label's result writer, without its host-side transpose.

MONAI Label's `Writer` copies the mask to the host (as float), reverses its axes there with a full copy (ITK wants
z, y, x order) and converts the dtype: for a 512x512x55 mask that is ~150 ms of a click's time. Here the mask is
cast to uint8 and its axes reversed on the device, one compact copy comes to the host, and ITK writes a view of it.
The file is the same: same writer (ITK), same geometry (code below follows monailabel.transform.writer.write_itk).
A `.nii.gz` is written by ITK uncompressed and gzipped here at level 1: ITK's own NIfTI gzip (nifticlib, zlib at its
default level; ITK ignores a compression level for NIfTI) took 2.3-2.7 s for a 512x512x397 label on the H200 machine's
host, most of a batch study's time. The decompressed bytes are the same as ITK's.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import itk
import numpy as np
import torch
from monai.data import MetaTensor
from monailabel.transform.writer import Writer
from monailabel.utils.others.generic import file_ext

try:  # ISA-L's gzip: the same format, several times faster than zlib at level 1
    from isal import igzip as gzip
except ImportError:  # a machine without the wheel (the GPU machine's carried set) still writes valid files
    import gzip

GZIP_CHUNK = 16 * 2**20


def write_nifti_gz(image, path: str) -> None:
    """ITK writes the NIfTI uncompressed next to `path`; it is gzipped into `path` at level 1."""
    raw = path[: -len(".gz")]
    itk.imwrite(image, raw, False)
    try:
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, GZIP_CHUNK)
    finally:
        os.remove(raw)


def _itk_geometry(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Origin, spacing and direction of a RAS voxel-to-world affine, in ITK's LPS world (as write_itk does)."""
    lps = np.diag([-1, -1, 1, 1]) @ affine
    origin = lps[:3, 3]
    spacing = np.linalg.norm(lps[:3, :3], axis=0)
    direction = lps[:3, :3] @ np.diag(1 / spacing)
    return origin, spacing, direction


class DeviceLabelWriter(Writer):
    def __call__(self, data):
        label = data[self.label]
        ext = data.get(self.key_extension) or (file_ext(data["image_path"]) if data.get("image_path") else None)
        dtype = data.get(self.key_dtype)
        simple = (
            torch.is_tensor(label)
            and label.ndim == 3
            and ext
            and not ext.endswith(".seg.nrrd")
            and data.get(self.key_write_to_file, True)
            and str(dtype or "uint8") in ("uint8", "<class 'numpy.uint8'>")
        )
        if not simple or int(label.max()) > 255:
            return super().__call__(data)
        meta = data.get(f"{self.ref_image}_{self.meta_key_postfix}")
        affine = meta.get("affine") if meta else None
        if affine is None and isinstance(label, MetaTensor):
            affine = label.affine
        zyx = torch.as_tensor(label).to(torch.uint8).permute(2, 1, 0).contiguous().cpu().numpy()
        image = itk.image_view_from_array(zyx)
        if affine is not None:
            origin, spacing, direction = _itk_geometry(np.asarray(torch.as_tensor(affine).cpu(), dtype=np.float64))
            image.SetDirection(itk.matrix_from_array(direction))
            image.SetSpacing(spacing)
            image.SetOrigin(origin)
        output_file = tempfile.NamedTemporaryFile(suffix=ext).name
        if output_file.endswith(".nii.gz"):
            write_nifti_gz(image, output_file)
        else:
            itk.imwrite(image, output_file, bool(data.get(self.key_compress, False)))
        return output_file, data.get(self.json, {})
