"""DeviceLabelWriter writes the very file MONAI Label's Writer writes (voxels and geometry), only faster."""

from __future__ import annotations

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from monai.data import MetaTensor
from monailabel.transform.writer import Writer

from rocm_zoo.server.store.label_writer import DeviceLabelWriter

RAS = np.array([[0.98, 0, 0, -250.0], [0, 0.98, 0, -240.0], [0, 0, 5.0, 30.0], [0, 0, 0, 1]])
LPS = np.diag([-1.0, -1.0, 1.0, 1.0]) @ RAS  # the same voxels stored with the x and y axes flipped
OBLIQUE = RAS @ np.array([[0.96, -0.28, 0, 0], [0.28, 0.96, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])


@pytest.mark.parametrize("affine", [RAS, LPS, OBLIQUE], ids=["ras", "lps", "oblique"])
@pytest.mark.parametrize("ext", [".nrrd", ".nii.gz"])
def test_same_file_as_monailabel_writer(affine, ext):
    gen = torch.Generator().manual_seed(0)
    label = (torch.rand(37, 29, 11, generator=gen) * 3).floor()  # float labels 0..2, as argmax gives them
    data = {"pred": MetaTensor(label, affine=torch.as_tensor(affine)), "result_extension": ext,
            "result_dtype": "uint8", "image_path": "x.nii.gz"}
    stock_file, _ = Writer(label="pred", json="result")(dict(data))
    fast_file, _ = DeviceLabelWriter(label="pred", json="result")(dict(data))
    stock, fast = sitk.ReadImage(stock_file), sitk.ReadImage(fast_file)
    assert fast.GetPixelID() == sitk.sitkUInt8
    assert np.array_equal(sitk.GetArrayFromImage(fast), sitk.GetArrayFromImage(stock))
    for get in ("GetSize", "GetSpacing", "GetOrigin", "GetDirection"):
        assert np.allclose(getattr(fast, get)(), getattr(stock, get)(), atol=1e-6), get


def test_labels_beyond_uint8_fall_back_to_the_stock_writer():
    label = torch.full((4, 4, 4), 300.0)
    data = {"pred": MetaTensor(label, affine=torch.eye(4, dtype=torch.float64)), "result_extension": ".nrrd",
            "image_path": "x.nii.gz"}
    out, _ = DeviceLabelWriter(label="pred", json="result")(data)
    assert sitk.GetArrayFromImage(sitk.ReadImage(out)).max() == 300


def test_nifti_gz_holds_the_bytes_itk_writes(tmp_path):
    import gzip

    import itk

    from rocm_zoo.server.store.label_writer import write_nifti_gz

    zyx = (np.random.default_rng(0).random((11, 29, 37)) * 3).astype(np.uint8)
    image = itk.image_view_from_array(zyx)
    image.SetSpacing([0.98, 0.98, 5.0])
    itk.imwrite(image, str(tmp_path / "itk.nii.gz"), True)
    write_nifti_gz(image, str(tmp_path / "ours.nii.gz"))
    assert gzip.decompress((tmp_path / "ours.nii.gz").read_bytes()) == gzip.decompress((tmp_path / "itk.nii.gz").read_bytes())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["itk.nii.gz", "ours.nii.gz"]  # no uncompressed file left
