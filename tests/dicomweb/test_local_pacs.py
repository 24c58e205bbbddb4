"""The local PACS: Orthanc with DICOMweb on loopback holds the phantom series, and WADO-RS gives back their voxels."""

from __future__ import annotations

import numpy as np
import requests
from dicomweb_client import DICOMwebClient

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import read_series


def test_qido_lists_every_phantom_series(local_pacs):
    client = DICOMwebClient(local_pacs.config.dicomweb_url)
    found = {ds["0020000E"]["Value"][0] for ds in client.search_for_series()}
    assert {series for _, series in local_pacs.uids.values()} <= found


def test_wado_returns_the_phantom_voxels(local_pacs, tmp_path):
    spec = local_pacs.specs[1]
    study, series = local_pacs.uids[spec.name]
    client = DICOMwebClient(local_pacs.config.dicomweb_url)
    files = []
    for i, ds in enumerate(client.retrieve_series(study, series)):
        files.append(tmp_path / f"{i}.dcm")
        ds.save_as(files[-1])
    volume, _ = read_series(files)
    np.testing.assert_array_equal(volume, phantom.make_phantom(spec).image)


def test_storage_is_ours_and_only_loopback_is_served(local_pacs):
    from rocm_zoo.bench.pacs import orthanc_settings

    written = orthanc_settings(local_pacs.config)
    assert written["RemoteAccessAllowed"] is False and written["DicomServerEnabled"] is False
    assert any((local_pacs.config.folder / "storage").iterdir())
    assert requests.get(f"{local_pacs.config.url}/system", timeout=10).json()["Name"] == "rocm_zoo"
