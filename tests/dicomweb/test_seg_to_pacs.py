"""rocm_zoo against a real DICOMweb PACS: an automatic segmentation of a phantom series is stored back to Orthanc as
DICOM SEG with the task's label names and colours, and the SEG read back from Orthanc is exactly the mask produced."""

from __future__ import annotations

import json

import numpy as np
import pydicom
import pytest
import requests
from dicomweb_client import DICOMwebClient

from rocm_zoo.dicomweb import dicom_seg
from rocm_zoo.dicomweb.store import label_colour, read_label

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
    ordered, expected = dicom_seg.to_source_frames(produced, affine, source)
    np.testing.assert_array_equal(dicom_seg.decode(seg, source), expected.transpose(2, 1, 0))

    labels = requests.get(f"{pacs_server.url}/info/", timeout=30).json()["models"]["wholeBody_ct"]["labels"]
    names = {int(v): k for k, v in labels.items()}
    values = dicom_seg.segment_values(seg)
    for item in seg.SegmentSequence:
        value = values[int(item.SegmentNumber)]
        assert str(item.SegmentLabel) == names[value]
        assert list(item.RecommendedDisplayCIELabValue) == list(dicom_seg._cielab(label_colour(names[value])))
    assert sorted(values.values()) == sorted(int(v) for v in np.unique(produced) if v)
