"""OHIF without a PACS: the server answers OHIF's DICOMweb reads (`/proxy/dicom/qido`, `/proxy/dicom/wado`) for its
local studies folder, as the viewer's data source asks them, and takes the series UIDs it shows as image ids in
`/infer` and `/datastore/label`, as the OHIF panel sends them. Checked against the NIfTI files themselves: the series
read back as a PACS reader would (SimpleITK over the instances) is the datastore's volume, voxel for voxel and in
the same place; an inference named by series UID gives the label the datastore id gives."""

from __future__ import annotations

import email
import json

import nibabel as nib
import numpy as np
import pydicom
import pytest
import requests
import SimpleITK as sitk

from rocm_zoo.dicom_volume import local_series_uids

pytestmark = pytest.mark.slow
QIDO, WADO = "/proxy/dicom/qido", "/proxy/dicom/wado"
IMAGE = "phantom_lps"  # stored LPS: OHIF's series and the NIfTI must still agree in world coordinates


def _json(r: requests.Response) -> list[dict]:
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"].startswith("application/dicom+json")
    return r.json()


def _frame(r: requests.Response) -> bytes:
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].startswith("multipart/related")
    message = email.message_from_bytes(b"Content-Type: " + r.headers["content-type"].encode() + b"\r\n\r\n"
                                       + r.content)
    parts = message.get_payload()
    assert len(parts) == 1 and parts[0].get_content_type() == "application/octet-stream"
    return parts[0].get_payload(decode=True)


def test_ohif_lists_and_reads_every_local_study(server, sample_env, tmp_path):
    ids = sorted(p.name.split(".")[0] for p in sample_env.paths.studies.glob("*.nii.gz"))
    studies = _json(requests.get(f"{server}{QIDO}/studies", params={"limit": 101, "offset": 0,
                                                                     "fuzzymatching": "true"}, timeout=60))
    listed = {s["00100020"]["Value"][0]: s["0020000D"]["Value"][0] for s in studies}
    assert set(ids) <= set(listed), (ids, listed)
    assert all(listed[i] == local_series_uids(i)[0] for i in ids)

    study_uid, series_uid = local_series_uids(IMAGE)
    found = _json(requests.get(f"{server}{QIDO}/studies", params={"StudyInstanceUID": study_uid}, timeout=60))
    assert [s["0020000D"]["Value"][0] for s in found] == [study_uid]
    by_name = _json(requests.get(f"{server}{QIDO}/studies", params={"PatientName": "phantom_l*",
                                                                     "fuzzymatching": "true"}, timeout=60))
    assert IMAGE in {s["00100020"]["Value"][0] for s in by_name}
    assert len(_json(requests.get(f"{server}{QIDO}/studies", params={"limit": 1, "offset": 1}, timeout=60))) == 1
    series = _json(requests.get(f"{server}{QIDO}/studies/{study_uid}/series", timeout=60))
    assert [s["0020000E"]["Value"][0] for s in series] == [series_uid]

    # Metadata and frames, as OHIF asks them: read back as a PACS reader would, they are the NIfTI volume.
    metadata = _json(requests.get(f"{server}{WADO}/studies/{study_uid}/series/{series_uid}/metadata", timeout=300))
    nifti = sitk.ReadImage(str(sample_env.image_path(IMAGE)))
    assert len(metadata) == nifti.GetSize()[2]
    folder = tmp_path / "series"
    folder.mkdir()
    for n, instance in enumerate(metadata):
        ds = pydicom.Dataset.from_json(instance)
        url = (f"{server}{WADO}/studies/{study_uid}/series/{series_uid}/instances/{ds.SOPInstanceUID}/frames/1")
        ds.PixelData = _frame(requests.get(url, headers={"Accept": "multipart/related; type=application/octet-stream"},
                                           timeout=60))
        ds.file_meta = pydicom.dataset.FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
        ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.save_as(folder / f"{n:04d}.dcm", write_like_original=False)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    series_volume = reader.Execute()
    assert np.array_equal(sitk.GetArrayFromImage(series_volume), sitk.GetArrayFromImage(nifti).astype(np.int16))
    assert np.allclose(series_volume.GetOrigin(), nifti.GetOrigin(), atol=1e-3)
    assert np.allclose(series_volume.GetSpacing(), nifti.GetSpacing(), atol=1e-4)
    assert np.allclose(series_volume.GetDirection(), nifti.GetDirection(), atol=1e-5)


def test_the_series_uid_names_the_image_for_infer_and_label_saves(server, sample_env, tmp_path):
    _, series_uid = local_series_uids(IMAGE)
    labels = []
    for image in (IMAGE, series_uid):
        r = requests.post(f"{server}/infer/wholeBody_ct", params={"image": image, "output": "image"}, timeout=900)
        assert r.status_code == 200, r.text[:500]
        (tmp_path / "label.nii.gz").write_bytes(r.content)
        labels.append(np.asarray(nib.load(tmp_path / "label.nii.gz").dataobj))
    assert labels[0].any() and np.array_equal(labels[0], labels[1])

    truth = sample_env.paths.truth / f"{IMAGE}.nii.gz"
    try:
        with open(truth, "rb") as f:  # as OHIF's save_label sends it: the series UID as the image
            r = requests.put(f"{server}/datastore/label", params={"image": series_uid, "tag": "ohif_local"},
                             files={"label": ("label.nii.gz", f)},
                             data={"params": json.dumps({"label_info": [{"name": "spleen", "idx": 1}]})}, timeout=120)
        assert r.status_code == 200, r.text[:500]
        stored = sample_env.paths.studies / "labels" / "ohif_local" / f"{IMAGE}.nii.gz"
        assert stored.read_bytes() == truth.read_bytes()
        back = requests.get(f"{server}/datastore/label", params={"label": IMAGE, "tag": "ohif_local"}, timeout=60)
        assert back.status_code == 200 and back.content == truth.read_bytes(), back.text[:300]
    finally:
        requests.delete(f"{server}/datastore/label", params={"id": IMAGE, "tag": "ohif_local"}, timeout=60)


def test_what_the_local_dicomweb_refuses(server):
    study_uid, series_uid = local_series_uids(IMAGE)
    unknown = "1.2.3.4.5.6.7.8.9"
    for path, status in ((f"{QIDO}/studies/{unknown}/series", 404),
                         (f"{WADO}/studies/{study_uid}/series/{unknown}/metadata", 404),
                         (f"{WADO}/studies/{study_uid}/series/{series_uid}/instances/{unknown}/frames/1", 404),
                         (f"{WADO}/studies/{study_uid}/series/{series_uid}/rendered", 404),
                         (f"{QIDO}/studies/%2E%2E/series", 422)):
        r = requests.get(server + path, timeout=60)
        assert r.status_code == status, (path, r.status_code, r.text[:300])
        assert "detail" in r.json()
    r = requests.get(f"{server}{QIDO}/studies", params={"limit": "many"}, timeout=60)
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    r = requests.post(f"{server}/proxy/dicom/stow/studies", data=b"x", timeout=60)
    assert r.status_code == 422 and "/datastore/label" in r.json()["detail"]
    r = requests.post(f"{server}/infer/wholeBody_ct", params={"image": unknown}, timeout=60)
    assert r.status_code == 404, r.text[:300]

