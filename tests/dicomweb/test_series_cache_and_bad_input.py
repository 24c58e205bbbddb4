"""DICOMweb sessions: a series is fetched and converted once and reused while it is unchanged in the PACS, converted
again when it changes; bad input from the PACS path (single slice, mixed sizes, a study deleted mid-session, the PACS
down) gets a clear 4xx/5xx with the reason and the server keeps serving. Real Orthanc, real server."""

from __future__ import annotations

import json

import nibabel as nib
import pytest
import requests

from rocm_zoo.bench import pacs

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import series_uids, slice_datasets
from pacs_upload import upload_datasets

pytestmark = pytest.mark.slow
MODEL = "wholeBody_ct"


def _infer(url: str, series: str) -> requests.Response:
    return requests.post(f"{url}/infer/{MODEL}", params={"image": series, "output": "json"},
                         files={"params": (None, json.dumps({}))}, timeout=900)


def _phantom(name: str, seed: int, shape=(48, 44, 14)) -> phantom.Phantom:
    return phantom.make_phantom(phantom.PhantomSpec(name, shape, (6.0, 6.0, 8.0), seed=seed))


def test_repeated_requests_reuse_the_converted_series(pacs_server, local_pacs):
    _, series = local_pacs.uids[local_pacs.specs[0].name]
    assert _infer(pacs_server.url, series).status_code == 200
    converted = pacs_server.converted(series)
    before = converted.stat()
    for _ in range(2):
        assert _infer(pacs_server.url, series).status_code == 200
    after = converted.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_changed_series_is_fetched_and_converted_again(pacs_server, local_pacs, tmp_path):
    ph = _phantom("cache_changes", 2_000_010)
    datasets = slice_datasets(ph)
    upload_datasets(local_pacs, datasets, tmp_path / "v1")
    _, series = series_uids(ph)
    r = _infer(pacs_server.url, series)
    assert r.status_code == 200, r.text
    assert nib.load(pacs_server.converted(series)).shape[2] == 14
    # The PACS loses the top slice (a new version of the series): the next request sees 13 slices.
    hit = requests.post(f"{local_pacs.config.url}/tools/lookup", data=str(datasets[-1].SOPInstanceUID), timeout=30)
    requests.delete(f"{local_pacs.config.url}/instances/{hit.json()[0]['ID']}", timeout=30).raise_for_status()
    r = _infer(pacs_server.url, series)
    assert r.status_code == 200, r.text
    assert nib.load(pacs_server.converted(series)).shape[2] == 13


def test_single_slice_series_is_refused_with_the_reason(pacs_server, local_pacs, tmp_path):
    ph = _phantom("bad_single", 2_000_011)
    upload_datasets(local_pacs, slice_datasets(ph)[:1], tmp_path)
    r = _infer(pacs_server.url, series_uids(ph)[1])
    assert r.status_code == 422 and "not a CT volume" in r.text and "1 image" in r.text, r.text


def test_mixed_size_series_is_refused_with_the_reason(pacs_server, local_pacs, tmp_path):
    ph = _phantom("bad_mixed", 2_000_012)
    datasets = slice_datasets(ph)
    odd = datasets[5]
    pixels = odd.pixel_array[:-4, :]
    odd.Rows, odd.PixelData = pixels.shape[0], pixels.tobytes()
    upload_datasets(local_pacs, datasets, tmp_path)
    r = _infer(pacs_server.url, series_uids(ph)[1])
    assert r.status_code == 422 and "different sizes" in r.text, r.text


def test_study_deleted_mid_session_is_404(pacs_server, local_pacs, tmp_path):
    ph = _phantom("deleted", 2_000_013)
    upload_datasets(local_pacs, slice_datasets(ph), tmp_path)
    study, series = series_uids(ph)
    assert _infer(pacs_server.url, series).status_code == 200
    assert pacs.delete_study(local_pacs.config, study)
    r = _infer(pacs_server.url, series)
    assert r.status_code == 404 and "not in the PACS" in r.text, r.text
    assert pacs_server.converted(series) is None  # the stale conversion is gone


def test_pacs_down_is_503_and_a_retry_works_once_it_is_back(pacs_server, local_pacs):
    _, series = local_pacs.uids[local_pacs.specs[0].name]
    pacs.stop(local_pacs.process)
    try:
        r = _infer(pacs_server.url, series)
        assert r.status_code == 503 and "does not answer" in r.text and "Retry" in r.text, r.text
    finally:
        local_pacs.restart()
    assert _infer(pacs_server.url, series).status_code == 200
    assert requests.get(f"{pacs_server.url}/info/", timeout=30).status_code == 200
