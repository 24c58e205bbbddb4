"""DICOM SEG with highdicom: a phantom's truth labels written against its CT series and read back are the same
voxels, whatever axis order and flips the label volume was stored with; names, colours and label values survive."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest

from rocm_zoo.dicomweb import dicom_seg

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import slice_datasets

SPEC = phantom.PhantomSpec("seg_lps", (40, 36, 12), (4.0, 4.5, 5.0), seed=11, orientation="LPS")


@pytest.fixture(scope="module")
def ph():
    return phantom.make_phantom(SPEC)


def _roundtrip(label, affine, source, segments):
    seg = dicom_seg.encode(label, affine, source, segments, algorithm="test_model")
    seg = pydicom.dcmread(pydicom.filebase.DicomBytesIO(_bytes(seg)))  # as the PACS would hand it back
    return seg, dicom_seg.decode(seg, source)


def _bytes(ds) -> bytes:
    buf = pydicom.filebase.DicomBytesIO()
    ds.save_as(buf, write_like_original=False)
    return buf.getvalue()


def test_truth_roundtrips_exactly(ph):
    source = slice_datasets(ph)
    segments = {1: dicom_seg.Segment(1, "spleen", (157, 108, 162)), 4: dicom_seg.Segment(4, "liver", (221, 130, 101))}
    seg, back = _roundtrip(ph.truth, ph.affine, source, segments)
    np.testing.assert_array_equal(back, ph.truth)
    names = {int(s.SegmentNumber): str(s.SegmentLabel) for s in seg.SegmentSequence}
    values = dicom_seg.segment_values(seg)
    assert {values[n]: names[n] for n in names}[1] == "spleen"
    assert {values[n]: names[n] for n in names}[4] == "liver"
    assert sorted(values.values()) == sorted(int(v) for v in np.unique(ph.truth) if v)
    spleen = next(s for s in seg.SegmentSequence if s.SegmentLabel == "spleen")
    assert len(spleen.RecommendedDisplayCIELabValue) == 3


def test_label_stored_in_another_axis_order_maps_back(ph):
    # What a NIfTI round trip can do: axes swapped and flipped, the affine saying so.
    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1, ph.truth.shape[0] - 1
    label = np.flip(ph.truth, 0).transpose(1, 0, 2)
    swap = np.eye(4)[[1, 0, 2, 3]]
    affine = ph.affine @ flip @ swap
    _, back = _roundtrip(label, affine, slice_datasets(ph), {})
    np.testing.assert_array_equal(back, ph.truth)


def test_off_grid_and_empty_labels_are_refused(ph):
    source = slice_datasets(ph)
    shifted = ph.affine.copy()
    shifted[:3, 3] += 1.3
    with pytest.raises(dicom_seg.SegError, match="grid"):
        dicom_seg.encode(ph.truth, shifted, source, {}, algorithm="m")
    with pytest.raises(dicom_seg.SegError, match="empty"):
        dicom_seg.encode(np.zeros_like(ph.truth), ph.affine, source, {}, algorithm="m")


@pytest.mark.parametrize("values", [(2, 9, 104), tuple(range(1, 301))], ids=["sparse values", "300 values (uint16)"])
def test_many_and_sparse_label_values_roundtrip(ph, values):
    # Segment numbers run 1..N whatever the label values are; the SEG is built from one label map, not a mask each.
    rng = np.random.default_rng(5)
    label = np.asarray(values, dtype=np.uint16)[rng.integers(0, len(values), ph.truth.shape)]
    label[ph.truth == 0] = 0
    seg, back = _roundtrip(label, ph.affine, slice_datasets(ph), {})
    np.testing.assert_array_equal(back, label)
    assert sorted(dicom_seg.segment_values(seg).values()) == sorted(int(v) for v in np.unique(label) if v)
