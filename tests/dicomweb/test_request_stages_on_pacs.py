"""Per-stage timings of a request on the DICOMweb path, real server and real Orthanc: a new series is fetched and
converted, the label is encoded as SEG and stored; a repeated request only looks the series up. Every stage is in the
response's `latencies.stages` and in the server's log line, positive where it ran, and together no more than the
request."""

from __future__ import annotations

import json

import pytest
import requests

from rocm_zoo.samples import phantom

from rocm_zoo.samples.dicom_series import series_uids, slice_datasets
from rocm_zoo.server.http import request_stages
from pacs_upload import upload_datasets

pytestmark = pytest.mark.slow
# The task's latencies come rounded to 10 ms by MONAI Label (`infer`); the sum may exceed the request by that much.
ROUNDING_S = 0.005


def _stages(url: str, series: str, params: dict) -> dict:
    r = requests.post(f"{url}/infer/wholeBody_ct", params={"image": series, "output": "json"},
                      files={"params": (None, json.dumps(params))}, timeout=900)
    assert r.status_code == 200, r.text[:2000]
    return r.json()["latencies"]["stages"]


def _check_sum(s: dict) -> None:
    assert all(s[k] >= 0 for k in request_stages.STAGES), s
    assert sum(s[k] for k in request_stages.STAGES) <= s["request"] + ROUNDING_S, s


def test_stage_timings_of_a_new_series_and_of_a_repeat(pacs_server, local_pacs, tmp_path):
    ph = phantom.make_phantom(phantom.PhantomSpec("stages", (48, 44, 14), (6.0, 6.0, 8.0), seed=2_000_020))
    upload_datasets(local_pacs, slice_datasets(ph), tmp_path)
    _, series = series_uids(ph)

    first = _stages(pacs_server.url, series, {"save_label": True, "label_tag": "original"})
    _check_sum(first)
    assert all(first[k] > 0 for k in request_stages.STAGES), first  # fetched, converted, inferred, encoded, stored

    repeat = _stages(pacs_server.url, series, {})
    _check_sum(repeat)
    assert repeat["fetch_series"] > 0 and repeat["infer"] > 0, repeat  # the look-up, and the model
    assert repeat["convert"] == 0 and repeat["encode_seg"] == 0 and repeat["store"] == 0, repeat

    logged = [s for s in map(request_stages.parse_line, pacs_server.log.read_text().splitlines())
              if s and s["image"] == series]
    assert len(logged) == 2, "one log line per request"
    for line, response in zip(logged, (first, repeat)):
        for k in request_stages.STAGES + ("request",):
            assert line[k] == pytest.approx(response[k], abs=0.001)
