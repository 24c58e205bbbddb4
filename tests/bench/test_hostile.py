"""The hostile payloads of `rocm-zoo bench-load --hostile` and the security tests are what they say: an archive
member that climbs out, and NIfTI headers whose gzip stream inflates about a thousand times."""

from __future__ import annotations

import gzip
import io
import tarfile

import nibabel as nib
import numpy as np

from rocm_zoo.bench import hostile


def test_slip_tar_has_a_member_outside_its_folder():
    with tarfile.open(fileobj=io.BytesIO(hostile.slip_tar("../../x.txt"))) as tar:
        assert tar.getnames() == ["image.txt", "../../x.txt"]
        assert tar.extractfile("../../x.txt").read() == b"written outside the session folder"


def test_bomb_announces_its_shape_and_inflates_far_beyond_its_size():
    data = hostile.bomb_nifti_gz((4096, 4096, 4096), 64 << 20)
    assert len(data) < 200_000 and hostile.inflated_size(data) == 348 + 4 + (64 << 20)
    header = nib.Nifti1Header.from_fileobj(io.BytesIO(gzip.decompress(data)[:352]))
    assert header.get_data_shape() == (4096, 4096, 4096) and header.get_data_dtype() == np.uint8


def test_a_bomb_with_a_small_shape_reads_as_that_volume(tmp_path):
    """What a reader without a cap sees: a valid volume, with megabytes of stream after it."""
    path = tmp_path / "label.nii.gz"
    path.write_bytes(hostile.bomb_nifti_gz((8, 8, 4), 1 << 20, spacing=(2.0, 2.0, 3.0)))
    img = nib.load(str(path))
    assert img.shape == (8, 8, 4) and img.header.get_zooms() == (2.0, 2.0, 3.0)
    assert not np.asarray(img.dataobj).any()
