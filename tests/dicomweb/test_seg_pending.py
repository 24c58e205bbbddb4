"""A label for a series that DICOM SEG cannot describe (no Frame of Reference UID) is not lost: the server keeps it
in its pending folder and answers 422 with the reason (not a 500 from an unhandled ValueError); once the series is
fixed in the PACS, `rocm-zoo pacs push` stores it as SEG, and the SEG read back from Orthanc is the label."""

from __future__ import annotations

import json
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import requests
from dicomweb_client import DICOMwebClient

from pacs_upload import upload_datasets
from rocm_zoo.dicomweb import dicom_seg
from rocm_zoo.dicomweb.store import pending_folder
from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import series_uids, slice_datasets
from zoo_test_support import REPO, monailabel_server

pytestmark = pytest.mark.slow

SPEC = phantom.PhantomSpec("pacs_no_frame_of_reference", (48, 44, 12), (5.0, 5.2, 6.0), seed=2_000_015)


def _delete_series(local_pacs, series_uid: str) -> None:
    url = local_pacs.config.url
    hits = requests.post(f"{url}/tools/lookup", data=series_uid, timeout=30).json()
    for hit in hits:
        if hit.get("Type") == "Series":
            requests.delete(f"{url}/series/{hit['ID']}", timeout=60).raise_for_status()


def test_a_label_the_pacs_cannot_take_is_kept_and_pushed_later(local_pacs, sample_env, tmp_path):
    volume = phantom.make_phantom(SPEC)
    study_uid, series_uid = series_uids(volume)
    broken = slice_datasets(volume)
    for ds in broken:
        del ds.FrameOfReferenceUID
    upload_datasets(local_pacs, broken, tmp_path / "broken")
    cache = tmp_path / "dicom-cache"
    url = local_pacs.config.dicomweb_url
    with monailabel_server(sample_env.app_dir, url, "wholeBody_ct", tmp_path / "server.log", cwd=tmp_path,
                           timeout_s=900, env={"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor"),
                                               "MONAI_LABEL_DICOMWEB_CACHE_PATH": str(cache)}) as server:
        r = requests.get(f"{server}/datastore/image", params={"image": series_uid}, timeout=300)
        assert r.status_code == 200, r.text[:500]
        (tmp_path / "image.nii.gz").write_bytes(r.content)
        image = nib.load(str(tmp_path / "image.nii.gz"))
        label = np.zeros(image.shape[:3], np.uint8)
        label[10:30, 8:24, 3:9] = 1
        label[30:40, 30:40, 2:5] = 2
        nib.save(nib.Nifti1Image(label, image.affine), str(tmp_path / "label.nii.gz"))
        r = requests.put(f"{server}/datastore/label", params={"image": series_uid, "tag": "final"},
                         files={"label": ("label.nii.gz", (tmp_path / "label.nii.gz").read_bytes()),
                                "params": (None, json.dumps({"label_info": [{"name": "spleen", "idx": 1},
                                                                            {"name": "liver", "idx": 2}]}))},
                         timeout=300)
        assert r.status_code == 422, r.text[:500]
        detail = r.json()["detail"]
        assert "Frame Of Reference" in detail and "pending" in detail and "rocm-zoo pacs push" in detail, detail
        assert str(tmp_path) not in detail
        entry = pending_folder(url, str(cache)) / series_uid / "final"
        assert (entry / "meta.json").exists() and (entry / "label.nii.gz").exists()
        kept = np.asarray(nib.load(str(entry / "label.nii.gz")).dataobj)
        assert np.array_equal(kept, label), "the pending label is not the label sent"

        # Nothing can be pushed while the series is still broken: the label stays pending, exit status 1.
        push = [sys.executable, "-m", "rocm_zoo.cli", "pacs", "push", "--studies", url, "--cache", str(cache)]
        first = subprocess.run(push, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert first.returncode == 1 and "still pending" in first.stdout, first.stdout + first.stderr
        assert (entry / "meta.json").exists()

        # The series fixed in the PACS (same UIDs, now with a frame of reference), then pushed.
        _delete_series(local_pacs, series_uid)
        upload_datasets(local_pacs, slice_datasets(volume), tmp_path / "fixed")
        second = subprocess.run(push, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert second.returncode == 0 and "stored as SEG series" in second.stdout, second.stdout + second.stderr
        assert not entry.exists()

    client = DICOMwebClient(url)
    segs = [ds for hit in client.search_for_series(study_uid, search_filters={"Modality": "SEG"})
            for ds in client.retrieve_series(study_uid, hit["0020000E"]["Value"][0])
            if ds.ReferencedSeriesSequence[0].SeriesInstanceUID == series_uid]
    assert len(segs) == 1
    assert sorted(str(s.SegmentLabel) for s in segs[0].SegmentSequence) == ["liver", "spleen"]
    source = client.retrieve_series(study_uid, series_uid)
    decoded = dicom_seg.decode(segs[0], source)  # (column, row, slice) of the source grid
    assert sorted(np.unique(decoded).tolist()) == [0, 1, 2]
    assert [(decoded == v).sum() for v in (1, 2)] == [(label == v).sum() for v in (1, 2)]
