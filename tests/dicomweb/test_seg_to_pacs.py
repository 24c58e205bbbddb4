"""rocm_zoo against a real DICOMweb PACS: an automatic segmentation of a phantom series is stored back to Orthanc as
DICOM SEG with the task's label names and colours, and the SEG read back from Orthanc is exactly the mask produced.

The expected frames are worked out here, not by dicom_seg: each source instance's own ImagePositionPatient,
ImageOrientationPatient and PixelSpacing give every pixel's patient position, and the label's affine says which
label voxel lies there; the SEG's frames are read per referenced source instance. So a flipped or shifted axis in
the encoder cannot cancel out against the same mistake in the expectation."""

from __future__ import annotations

import json

import highdicom as hd
import numpy as np
import pytest
import requests
from dicomweb_client import DICOMwebClient

from rocm_zoo.dicomweb import dicom_seg
from rocm_zoo.dicomweb.dicom_seg import label_colour, read_label
from rocm_zoo.samples import phantom

pytestmark = pytest.mark.slow


def _infer(server, model, image, params, tmp_path):
    r = requests.post(f"{server}/infer/{model}", params={"image": image, "output": "image"},
                      files={"params": (None, json.dumps(params))}, timeout=900)
    assert r.status_code == 200, r.text[:2000]
    path = tmp_path / "label.nii.gz"
    path.write_bytes(r.content)
    return path


def _segs_of(client, study, series):
    out = []
    for hit in client.search_for_series(study, search_filters={"Modality": "SEG"}):
        seg_series = hit["0020000E"]["Value"][0]
        for ds in client.retrieve_series(study, seg_series):
            if ds.ReferencedSeriesSequence[0].SeriesInstanceUID == series:
                out.append(ds)
    return out


def _on_instance(volume: np.ndarray, affine_ras: np.ndarray, ds) -> np.ndarray:
    """The (row, column) frame of `volume` at source instance `ds`: each pixel's LPS position from the instance's
    own geometry, to RAS, to a voxel of `volume` through its affine (which must land on a voxel centre)."""
    iop = np.asarray(ds.ImageOrientationPatient, dtype=float)
    row_spacing, col_spacing = (float(v) for v in ds.PixelSpacing)
    r, c = np.mgrid[0:int(ds.Rows), 0:int(ds.Columns)]
    lps = (np.asarray(ds.ImagePositionPatient, dtype=float) + c[..., None] * col_spacing * iop[:3]
           + r[..., None] * row_spacing * iop[3:])
    ras = lps * [-1.0, -1.0, 1.0]
    ijk = (np.linalg.inv(affine_ras) @ np.concatenate([ras, np.ones_like(ras[..., :1])], -1)[..., None])[..., :3, 0]
    voxel = np.rint(ijk).astype(int)
    assert np.allclose(ijk, voxel, atol=1e-3), "the volume is not on the source instance's pixel grid"
    assert (voxel >= 0).all() and (voxel < volume.shape).all(), "the source instance lies outside the volume"
    return np.asarray(volume)[voxel[..., 0], voxel[..., 1], voxel[..., 2]]


def _seg_frames(seg, source) -> dict[str, np.ndarray]:
    """SOPInstanceUID of each source instance -> the SEG's label values on it (zeros where the SEG has no frame)."""
    reader = hd.seg.Segmentation.from_dataset(seg)
    numbers = reader.get_segment_numbers()
    values = dicom_seg.segment_values(seg)
    referenced = {str(u[2]) for u in reader.get_source_image_uids()}
    out = {}
    for ds in source:
        uid = str(ds.SOPInstanceUID)
        frame = np.zeros((int(ds.Rows), int(ds.Columns)), dtype=np.int32)
        if uid in referenced:
            masks = reader.get_pixels_by_source_instance([uid], segment_numbers=numbers,
                                                         assert_missing_frames_are_empty=True)[0]
            for j, number in enumerate(numbers):
                frame[masks[..., j] > 0] = values[number]
        out[uid] = frame
    return out


def test_the_datastore_is_the_pacs(pacs_server, local_pacs):
    stats = requests.get(f"{pacs_server.url}/datastore/?output=stats", timeout=60).json()
    assert stats["total"] >= len(local_pacs.uids), stats


def test_wholebody_label_is_stored_as_seg_and_reads_back_exactly(pacs_server, local_pacs, tmp_path):
    spec = local_pacs.specs[1]  # LPS-stored
    study, series = local_pacs.uids[spec.name]
    label_file = _infer(pacs_server.url, "wholeBody_ct", series, {"save_label": True, "label_tag": "original"}, tmp_path)
    produced, affine = read_label(str(label_file))
    assert produced.any(), "the seeded network gave an all-background label; pick another phantom"

    client = DICOMwebClient(local_pacs.config.dicomweb_url)
    segs = _segs_of(client, study, series)
    assert len(segs) == 1
    seg = segs[0]
    source = list(client.retrieve_series(study, series))
    # The mapping itself checked on the phantom: its HU volume through its affine is each instance's pixel data.
    ph = phantom.make_phantom(spec)
    for ds in source:
        np.testing.assert_array_equal(_on_instance(np.asarray(ph.image, dtype=np.int16), ph.affine, ds),
                                      ds.pixel_array)
    stored = _seg_frames(seg, source)
    assert len(stored) == len(source) == spec.shape[2]
    for ds in source:
        np.testing.assert_array_equal(stored[str(ds.SOPInstanceUID)], _on_instance(produced, affine, ds),
                                      err_msg=f"SEG frame of source instance {ds.InstanceNumber}")
    assert sum(int(f.astype(bool).sum()) for f in stored.values()) == int(np.count_nonzero(produced))

    labels = requests.get(f"{pacs_server.url}/info/", timeout=30).json()["models"]["wholeBody_ct"]["labels"]
    names = {int(v): k for k, v in labels.items()}
    values = dicom_seg.segment_values(seg)
    for item in seg.SegmentSequence:
        value = values[int(item.SegmentNumber)]
        assert str(item.SegmentLabel) == names[value]
        assert list(item.RecommendedDisplayCIELabValue) == list(dicom_seg._cielab(label_colour(names[value])))
    assert sorted(values.values()) == sorted(int(v) for v in np.unique(produced) if v)
