"""Phantoms as CT DICOM series: the same HU and geometry as the NIfTI phantom, read back by pydicom and by SimpleITK
(MONAI Label's converter), in both storage orientations."""

from __future__ import annotations

import numpy as np
import pytest

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import lps_affine, read_series, series_uids, write_series

SPECS = [phantom.PhantomSpec("dcm_ras", (40, 36, 12), (4.0, 4.5, 5.0), seed=7),
         phantom.PhantomSpec("dcm_lps", (36, 40, 10), (4.2, 4.0, 5.0), seed=8, orientation="LPS")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_series_holds_the_phantom(spec, tmp_path):
    ph = phantom.make_phantom(spec)
    files = write_series(ph, tmp_path / spec.name)
    assert len(files) == spec.shape[2]
    volume, affine = read_series(files)
    np.testing.assert_array_equal(volume, ph.image)
    np.testing.assert_allclose(affine, lps_affine(ph.affine), atol=1e-4)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_simpleitk_reads_the_series_like_the_nifti(spec, tmp_path):
    import SimpleITK as sitk

    ph = phantom.make_phantom(spec)
    write_series(ph, tmp_path / "s")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path / "s")))
    image = reader.Execute()
    # ITK index (x, y, z) is DICOM (column, row, slice): the same array as the phantom's own.
    np.testing.assert_array_equal(sitk.GetArrayFromImage(image).transpose(2, 1, 0), ph.image)
    lps = lps_affine(ph.affine)
    np.testing.assert_allclose(image.GetOrigin(), lps[:3, 3], atol=1e-4)
    np.testing.assert_allclose(image.GetSpacing(), np.linalg.norm(lps[:3, :3], axis=0), atol=1e-4)


def test_uids_are_stable():
    ph = phantom.make_phantom(SPECS[0])
    assert series_uids(ph) == series_uids(phantom.make_phantom(SPECS[0]))
    assert series_uids(ph) != series_uids(phantom.make_phantom(SPECS[1]))
