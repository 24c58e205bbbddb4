"""A local PACS for OHIF sessions: Debian's Orthanc with its DICOMweb plugin, storage in a folder of ours.

Orthanc 1.10 has no bind-address option; `RemoteAccessAllowed: false` makes it answer loopback clients only, and its
DICOM (DIMSE) listener is off: everything goes through HTTP and DICOMweb on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

logger = logging.getLogger(__name__)

ORTHANC_BINARY = "Orthanc"
DICOMWEB_PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
INSTALL_HINT = "install Debian's orthanc and orthanc-dicomweb: apt-get install -y orthanc orthanc-dicomweb"


class PacsError(RuntimeError):
    """The local PACS could not be started or did not take an upload; the message says why."""


@dataclass(frozen=True)
class PacsConfig:
    folder: Path  # holds orthanc.json, storage/ and orthanc.log
    http_port: int = 8042

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def dicomweb_url(self) -> str:
        return f"{self.url}/dicom-web"


def orthanc_settings(config: PacsConfig) -> dict:
    storage = str((config.folder / "storage").resolve())
    return {
        "Name": "rocm_zoo",
        "StorageDirectory": storage,
        "IndexDirectory": storage,
        "HttpPort": config.http_port,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "DicomServerEnabled": False,
        "HttpCompressionEnabled": False,
        "OrthancExplorerEnabled": True,
        "WebDavEnabled": False,
        "Plugins": [str(DICOMWEB_PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "EnableWado": True, "Host": "127.0.0.1", "Ssl": False},
    }


def check_installed() -> str:
    binary = shutil.which(ORTHANC_BINARY) or (f"/usr/sbin/{ORTHANC_BINARY}" if os.path.exists(f"/usr/sbin/{ORTHANC_BINARY}") else None)
    if not binary:
        raise PacsError(f"Orthanc is not installed: {INSTALL_HINT}")
    if not DICOMWEB_PLUGIN.exists():
        raise PacsError(f"Orthanc's DICOMweb plugin ({DICOMWEB_PLUGIN}) is missing: {INSTALL_HINT}")
    return binary


def is_up(config: PacsConfig, timeout: float = 2.0) -> bool:
    try:
        return requests.get(f"{config.url}/system", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def start(config: PacsConfig, wait_s: float = 60.0) -> subprocess.Popen:
    """Starts Orthanc in the background (the caller owns the process); returns once it answers."""
    binary = check_installed()
    if is_up(config):
        raise PacsError(f"something already answers on {config.url}; stop it or pick another --pacs-port")
    config.folder.mkdir(parents=True, exist_ok=True)
    settings_file = config.folder / "orthanc.json"
    settings_file.write_text(json.dumps(orthanc_settings(config), indent=2))
    log = open(config.folder / "orthanc.log", "ab")
    proc = subprocess.Popen([binary, str(settings_file)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    deadline = time.time() + wait_s
    while not is_up(config):
        if proc.poll() is not None:
            tail = (config.folder / "orthanc.log").read_text(errors="replace")[-3000:]
            raise PacsError(f"Orthanc exited with {proc.returncode}:\n{tail}")
        if time.time() > deadline:
            proc.terminate()
            raise PacsError(f"Orthanc did not answer on {config.url} within {wait_s:.0f} s")
        time.sleep(0.2)
    logger.info("Orthanc up on %s (storage %s)", config.url, config.folder / "storage")
    return proc


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def upload(config: PacsConfig, files: list[Path]) -> list[str]:
    """Stores DICOM files through Orthanc's REST API; returns the Orthanc ids of the series they belong to."""
    series = []
    with requests.Session() as http:
        for path in files:
            r = http.post(f"{config.url}/instances", data=path.read_bytes(),
                          headers={"Content-Type": "application/dicom"}, timeout=60)
            if r.status_code != 200:
                raise PacsError(f"Orthanc refused {path}: HTTP {r.status_code} {r.text[:300]}")
            parent = r.json().get("ParentSeries")
            if parent and parent not in series:
                series.append(parent)
    return series


def delete_study(config: PacsConfig, study_instance_uid: str) -> bool:
    """Deletes a study by its StudyInstanceUID; False when Orthanc does not have it."""
    r = requests.post(f"{config.url}/tools/lookup", data=study_instance_uid, timeout=30)
    r.raise_for_status()
    ids = [hit["ID"] for hit in r.json() if hit.get("Type") == "Study"]
    for orthanc_id in ids:
        requests.delete(f"{config.url}/studies/{orthanc_id}", timeout=60).raise_for_status()
    return bool(ids)
