"""series_check on pydicom headers: a phantom's CT series passes with its size; each defect README promises to refuse
(one image, missing position/orientation/size, mixed sizes, mixed orientations, two images on one position, uneven
slice spacing) raises InvalidRequest naming it. No PACS, no server: the same refusals through the server are in
test_series_refusals.py."""

from __future__ import annotations

import pytest

from rocm_zoo.dicomweb.series_check import check_series
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import slice_datasets

SPEC = phantom.PhantomSpec("series_check", (20, 18, 8), (10.0, 11.0, 12.0), seed=3_000_001, orientation="LPS")


@pytest.fixture
def headers():
    return slice_datasets(phantom.make_phantom(SPEC))


def _refused(headers) -> str:
    with pytest.raises(InvalidRequest) as caught:
        check_series("1.2.3", headers)
    message = str(caught.value)
    assert "series 1.2.3 is not a CT volume" in message, message
    return message


def test_a_regular_series_passes_with_its_size(headers):
    assert check_series("1.2.3", headers) == (20, 18, 8)
    assert check_series("1.2.3", headers[::-1]) == (20, 18, 8)  # instance order does not matter


def test_a_single_image_is_refused(headers):
    assert "1 image(s)" in _refused(headers[:1])


@pytest.mark.parametrize("tag", ["ImagePositionPatient", "ImageOrientationPatient", "Rows"])
def test_an_image_missing_geometry_tags_is_refused(headers, tag):
    delattr(headers[3], tag)
    message = _refused(headers)
    assert "1 image(s) lack position, orientation or size" in message and str(headers[3].SOPInstanceUID) in message


def test_mixed_sizes_are_refused(headers):
    headers[2].Rows = 14
    assert "different sizes [(14, 20), (18, 20)]" in _refused(headers)


def test_mixed_orientations_are_refused(headers):
    # slice 5 tilted about 6 degrees about the column axis, its position unchanged
    headers[5].ImageOrientationPatient = [-0.9945, 0.0, 0.1045, 0.0, -1.0, 0.0]
    assert "2 different orientations" in _refused(headers)


def test_orientations_equal_to_four_decimals_pass(headers):
    iop = [float(v) for v in headers[5].ImageOrientationPatient]
    headers[5].ImageOrientationPatient = [v + 1e-6 for v in iop]
    assert check_series("1.2.3", headers) == (20, 18, 8)


def test_two_images_on_one_position_are_refused(headers):
    headers[4].ImagePositionPatient = list(headers[3].ImagePositionPatient)
    assert "share one slice position" in _refused(headers)


def test_a_missing_slice_is_uneven_spacing(headers):
    message = _refused(headers[:4] + headers[5:])
    assert "not evenly spaced (12 to 24 mm)" in message, message


def test_spacing_within_tolerance_passes_and_beyond_it_is_refused(headers):
    z = [float(v) for v in headers[4].ImagePositionPatient]
    headers[4].ImagePositionPatient = [z[0], z[1], z[2] + 0.05]  # 0.4 % of 12 mm
    assert check_series("1.2.3", headers) == (20, 18, 8)
    headers[4].ImagePositionPatient = [z[0], z[1], z[2] + 0.5]  # 4 %
    assert "not evenly spaced" in _refused(headers)
