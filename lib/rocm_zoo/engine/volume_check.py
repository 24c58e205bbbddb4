"""Is this file a readable 3D volume? Checked before a file enters the datastore, so a corrupt upload is refused
with its reason instead of replacing a good image."""

from __future__ import annotations

from pathlib import Path

from rocm_zoo.errors import InvalidRequest


def check_volume(path: str | Path, name: str) -> tuple[int, ...]:
    """Reads the whole file (a truncated gzip stream only fails when its data is read); returns the shape."""
    lower = str(name).lower()
    try:
        if lower.endswith((".nii", ".nii.gz")):
            import nibabel as nib

            img = nib.load(str(path))
            shape = tuple(int(s) for s in img.shape)
            img.get_fdata(dtype="float32")
        elif lower.endswith(".nrrd"):
            import nrrd

            data, _ = nrrd.read(str(path))
            shape = tuple(int(s) for s in data.shape)
        else:
            return ()  # other formats (DICOM folders, images) are MONAI Label's to judge
    except Exception as e:
        raise InvalidRequest(f"'{name}' is not a readable volume: {first_line(e)}") from e
    if len(shape) not in (3, 4) or min(shape[:3]) < 1:
        raise InvalidRequest(f"'{name}' has shape {shape}; a 3D volume is expected")
    return shape


def first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
