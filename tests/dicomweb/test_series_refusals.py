"""The series checks README promises, through the real server against the local Orthanc: a series whose images lack
position/orientation, mix orientations, share a slice position or have a gap is refused with 422 and the reason
(never converted, never resampled), and the server keeps serving. Single-slice and mixed-size series are in
test_series_cache_and_bad_input.py; the checks themselves on pydicom headers in test_series_check.py."""

from __future__ import annotations

import json

import pytest
import requests

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import series_uids, slice_datasets
from pacs_upload import upload_datasets

pytestmark = pytest.mark.slow
MODEL = "wholeBody_ct"


def _missing_position(datasets):
    del datasets[6].ImagePositionPatient
    return datasets


def _tilted(datasets):
    datasets[6].ImageOrientationPatient = [0.9945, 0.0, 0.1045, 0.0, 1.0, 0.0]
    return datasets


def _duplicate_position(datasets):
    datasets[7].ImagePositionPatient = list(datasets[6].ImagePositionPatient)
    return datasets


def _gap(datasets):
    return datasets[:6] + datasets[7:]


DEFECTS = {  # name -> (what is done to the series, what the 422 must say)
    "missing tags": (_missing_position, "lack position, orientation or size"),
    "mixed orientations": (_tilted, "2 different orientations"),
    "duplicate positions": (_duplicate_position, "share one slice position"),
    "uneven spacing": (_gap, "not evenly spaced (8 to 16 mm)"),
}


def _infer(url: str, series: str) -> requests.Response:
    return requests.post(f"{url}/infer/{MODEL}", params={"image": series, "output": "json"},
                         files={"params": (None, json.dumps({}))}, timeout=900)


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_a_bad_series_is_refused_with_the_reason_and_the_server_keeps_serving(pacs_server, local_pacs, tmp_path,
                                                                             defect):
    spoil, reason = DEFECTS[defect]
    ph = phantom.make_phantom(phantom.PhantomSpec(f"bad_{defect.replace(' ', '_')}", (48, 44, 14), (6.0, 6.0, 8.0),
                                                  seed=2_000_020 + list(DEFECTS).index(defect)))
    upload_datasets(local_pacs, spoil(slice_datasets(ph)), tmp_path)
    series = series_uids(ph)[1]
    r = _infer(pacs_server.url, series)
    assert r.status_code == 422 and "not a CT volume" in r.text and reason in r.text, (r.status_code, r.text)
    assert pacs_server.converted(series) is None  # refused before conversion: nothing resampled, nothing kept
    assert requests.get(f"{pacs_server.url}/info/", timeout=30).status_code == 200
    _, good = local_pacs.uids[local_pacs.specs[0].name]
    assert _infer(pacs_server.url, good).status_code == 200
