"""Issue 31, items 1, 2, 4, 5 and 10 without a server: the safe archive extraction, the header-first volume checks
(bombs, truncated, header-only and NaN labels), the datastore refusing to replace an image, a full disk (507, the old
label intact), and the dataset zip that does not stay behind. The same attacks against a real server are in
test_upload_attacks.py."""

from __future__ import annotations

import errno
import gzip
import io
import os
import tarfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import nibabel as nib
import nrrd
import numpy as np
import pytest

from rocm_zoo.engine import atomic_files
from rocm_zoo.engine.volume_check import VolumeBudget, check_volume
from rocm_zoo.errors import AlreadyExists, InvalidRequest, UploadTooLarge
from rocm_zoo.server.store import archives
from rocm_zoo.server.store.archives import ArchiveLimits
from rocm_zoo.server.store.datastore import CheckedLocalDatastore
from rocm_zoo.server.store.uploads import check_label

AFFINE = np.diag([1.5, 1.5, 2.0, 1.0])
SHAPE = (16, 12, 8)


def _nii(path: Path, array: np.ndarray, affine=AFFINE) -> Path:
    nib.save(nib.Nifti1Image(array, affine), str(path))
    return path


def nifti_bomb(path: Path, shape, dtype, inflated_bytes: int, affine=AFFINE) -> Path:
    """A .nii.gz whose header announces `shape` and whose gzip stream inflates to `inflated_bytes` of zeros after
    it (a few MB on disk)."""
    header = nib.Nifti1Image(np.zeros((1, 1, 1), dtype), affine).header.copy()
    header.set_data_shape(shape)
    header["vox_offset"] = 352
    zeros = bytes(1 << 20)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(header.binaryblock + b"\0" * 4)
        for _ in range(inflated_bytes >> 20):
            out.write(zeros)
    return path


# --- archives (item 1) ----------------------------------------------------------------------------------------------

def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("evil", [
    [(_member("../../escaped.txt"), b"owned")],
    [(_member("/tmp/rocm_zoo_absolute_escape.txt"), b"owned")],
    [(_member("ok/../../escaped.txt"), b"owned")],
    [(_member("link", tarfile.SYMTYPE, "/etc"), None), (_member("link/escaped.txt"), b"owned")],
    [(_member("hard", tarfile.LNKTYPE, "/etc/passwd"), None)],
    [(_member("fifo", tarfile.FIFOTYPE), None)],
    [(_member("dev", tarfile.CHRTYPE), None)],
], ids=["dotdot", "absolute", "inner-dotdot", "symlink", "hardlink", "fifo", "device"])
def test_a_tar_member_outside_its_folder_or_not_a_file_is_refused_and_nothing_stays(tmp_path, evil):
    archive = _tar(tmp_path / "evil.tar.gz", [(_member("fine.nii.gz"), b"x" * 10)] + evil)
    target = tmp_path / "a" / "b" / "unpacked"
    with pytest.raises(InvalidRequest, match="outside its folder|not a regular file"):
        archives.extract(archive, target)
    assert not target.exists()
    assert not (tmp_path / "a" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/rocm_zoo_absolute_escape.txt").exists()


def test_a_zip_member_outside_its_folder_or_a_link_is_refused(tmp_path):
    for name in ("../escaped.txt", "/abs.txt", "C:/x.txt", "a/../../escaped.txt"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr(name, b"owned")
        with pytest.raises(InvalidRequest, match="outside its folder"):
            archives.extract(archive, tmp_path / "out")
        assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()
    with zipfile.ZipFile(archive, "w") as z:
        link = zipfile.ZipInfo("link")
        link.external_attr = (0o120777 << 16)  # a symlink, as Info-ZIP stores one
        z.writestr(link, "/etc/passwd")
    with pytest.raises(InvalidRequest, match="not a regular file"):
        archives.extract(archive, tmp_path / "out")


def test_archive_caps_on_members_and_inflated_bytes(tmp_path):
    many = _tar(tmp_path / "many.tar", [(_member(f"f{i}"), b"x") for i in range(30)])
    with pytest.raises(UploadTooLarge, match="more than 20 members"):
        archives.extract(many, tmp_path / "out", ArchiveLimits(max_members=20))
    assert not (tmp_path / "out").exists()
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.nii", bytes(64 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(UploadTooLarge, match="inflates to more than"):
        archives.extract(bomb, tmp_path / "out", ArchiveLimits(max_bytes=8 << 20))
    assert not (tmp_path / "out").exists()
    with pytest.raises(UploadTooLarge, match="100 times its own size"):  # the default: by its compression ratio
        archives.extract(bomb, tmp_path / "out", ArchiveLimits(ratio_floor=1 << 20))
    assert not (tmp_path / "out").exists()
    assert archives.extract(bomb, tmp_path / "out", ArchiveLimits(max_ratio=1000))  # what the caps allow passes
    good = _tar(tmp_path / "good.tar.gz", [(_member("series/1.dcm"), b"a"), (_member("series/2.dcm"), b"b")])
    written = archives.extract(good, tmp_path / "ok")
    assert sorted(p.relative_to(tmp_path / "ok").as_posix() for p in written) == ["series/1.dcm", "series/2.dcm"]


def test_monailabels_other_unpacking_datastores_are_never_built():
    """CVAT and XNAT datastores unpack with shutil.unpack_archive too; the app builds only its local or DICOMweb
    store, and no other module of the package unpacks an archive any other way than archives.extract."""
    app = (Path(__file__).parents[2] / "lib/rocm_zoo/app/app.py").read_text()
    assert "CVATDatastore" not in app and "XNATDatastore" not in app and "cvat" not in app.lower()
    # MONAI Label's own init_datastore (which reads MONAI_LABEL_DATASTORE=cvat|xnat) is never called
    assert "def init_datastore" in app and "super().init_datastore" not in app
    lib = Path(__file__).parents[2] / "lib/rocm_zoo"
    unpacking = [p for p in lib.rglob("*.py") if "unpack_archive(" in p.read_text() or ".extractall(" in p.read_text()]
    assert unpacking == [], unpacking


# --- volumes (items 2 and 5) ----------------------------------------------------------------------------------------

def test_a_label_that_inflates_past_its_header_is_refused_without_holding_it(tmp_path):
    image = _nii(tmp_path / "img.nii.gz", np.zeros(SHAPE, np.int16))
    bomb = nifti_bomb(tmp_path / "bomb.nii.gz", SHAPE, np.uint8, 512 << 20)
    assert bomb.stat().st_size < 4 << 20
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest, match="inflates past"):
            check_label(str(bomb), str(image))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB held while refusing a 512 MiB bomb"


def test_a_volume_over_the_budget_is_refused_from_its_header(tmp_path):
    bomb = nifti_bomb(tmp_path / "big.nii.gz", (1024, 1024, 1024), np.uint8, 0)  # announces 1 GiB, holds nothing
    start = time.perf_counter()
    with pytest.raises(UploadTooLarge, match="max_volume_voxels"):
        check_volume(bomb, "big.nii.gz", limits=VolumeBudget(max_voxels=500_000_000))
    with pytest.raises(UploadTooLarge, match="max_volume_gb"):
        check_volume(bomb, "big.nii.gz", limits=VolumeBudget(max_bytes=500_000_000))
    assert time.perf_counter() - start < 1
    # under the budget, the missing data is found (truncated), also from a stream that is never held whole
    with pytest.raises(InvalidRequest, match="truncated"):
        check_volume(bomb, "big.nii.gz")


def test_an_honest_large_volume_streams_through_in_bounded_memory(tmp_path):
    big = nifti_bomb(tmp_path / "big.nii.gz", (512, 512, 512), np.uint8, 128 << 20)  # exactly what it announces
    tracemalloc.start()
    try:
        assert check_volume(big, "big.nii.gz") == (512, 512, 512)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20


@pytest.mark.parametrize("case", ["truncated", "header-only", "96 bytes", "nan", "inf", "fraction", "negative",
                                  "other grid", "4 components", "detached nrrd"])
def test_a_broken_label_is_refused(tmp_path, case):
    image = _nii(tmp_path / "img.nii.gz", np.zeros(SHAPE, np.int16))
    good = _nii(tmp_path / "good.nii.gz", (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 3).astype(np.uint8))
    check_label(str(good), str(image))
    raw = gzip.decompress(good.read_bytes())
    path = tmp_path / "label.nii.gz"
    if case == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif case == "header-only":
        path.write_bytes(gzip.compress(raw[:352]))
    elif case == "96 bytes":
        path.write_bytes(good.read_bytes()[:96])
    elif case in ("nan", "inf", "fraction", "negative"):
        values = np.zeros(SHAPE, np.float32)
        values[3, 4, 5] = {"nan": np.nan, "inf": np.inf, "fraction": 0.5, "negative": -1}[case]
        _nii(path, values)
    elif case == "other grid":
        _nii(path, np.zeros(SHAPE, np.uint8), AFFINE @ np.diag([2, 1, 1, 1]))
    elif case == "4 components":
        _nii(path, np.zeros(SHAPE + (4,), np.uint8))
    else:
        path = tmp_path / "label.nrrd"
        path.write_text("NRRD0004\ntype: uint8\ndimension: 3\nsizes: 16 12 8\nencoding: raw\n"
                        "data file: /etc/passwd\n\n")
    with pytest.raises(InvalidRequest):
        check_label(str(path), str(image))


def test_nrrd_labels_are_streamed_too(tmp_path):
    label = np.zeros(SHAPE, np.uint8)
    label[2:5, 2:5, 2:5] = 2
    path = tmp_path / "label.nrrd"
    nrrd.write(str(path), label, {"encoding": "gzip", "space": "left-posterior-superior",
                                  "space directions": np.diag([1.5, 1.5, 2.0]), "space origin": [0, 0, 0]})
    header = nrrd.read_header(str(path))
    assert header["encoding"] == "gzip"
    # the geometry is ITK's reading of both headers (NRRD's LPS vs NIfTI's RAS): only the values are judged here
    assert check_volume(path, "label.nrrd") == SHAPE
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(InvalidRequest):
        check_volume(path, "label.nrrd")


# --- the datastore (items 4 and 10) ---------------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    _nii(studies / "ct_a.nii.gz", np.zeros(SHAPE, np.int16))
    return CheckedLocalDatastore(str(studies), extensions=("*.nii.gz",))


def test_an_existing_image_is_not_replaced(store, tmp_path):
    label = _nii(tmp_path / "final.nii.gz", np.ones(SHAPE, np.uint8))
    store.save_label("ct_a", str(label), "final", {})
    other = _nii(tmp_path / "other.nii", np.full(SHAPE, 7, np.int16))  # another extension: MONAI Label's orphan case
    for name in (str(other), str(_nii(tmp_path / "same.nii.gz", np.full(SHAPE, 7, np.int16)))):
        with pytest.raises(AlreadyExists, match="delete it first"):
            store.add_image("ct_a", name, {})
    assert store.get_label_by_image_id("ct_a", "final")
    assert np.asarray(nib.load(store.get_image_uri("ct_a")).dataobj).max() == 0
    assert store.add_image("ct_new", str(other), {}) == "ct_new"


def test_a_full_disk_keeps_the_old_label_and_answers_507(store, tmp_path, monkeypatch):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from rocm_zoo.server.http import errors as http_errors

    old = _nii(tmp_path / "old.nii.gz", np.ones(SHAPE, np.uint8))
    store.save_label("ct_a", str(old), "final", {})
    real_copy = atomic_files.shutil.copyfileobj

    def half_then_full(src, dst, length=0):
        dst.write(src.read(100))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_files.shutil, "copyfileobj", half_then_full)
    new = _nii(tmp_path / "new.nii.gz", np.full(SHAPE, 2, np.uint8))
    with pytest.raises(OSError) as e:
        store.save_label("ct_a", str(new), "final", {})
    monkeypatch.setattr(atomic_files.shutil, "copyfileobj", real_copy)
    stored = store.get_label_uri("ct_a", "final")
    assert np.asarray(nib.load(stored).dataobj).max() == 1  # the old label, whole
    assert not [p for p in Path(stored).parent.iterdir() if p.name != Path(stored).name]

    web = FastAPI()

    @web.get("/save")
    def save():
        raise e.value

    http_errors.install(web)
    r = TestClient(web, raise_server_exceptions=False).get("/save")
    assert r.status_code == 507 and "disk is full" in r.json()["detail"], r.text


def test_the_dataset_zip_is_removed_when_writing_it_fails(store, tmp_path, monkeypatch):
    import tempfile

    _nii(tmp_path / "l.nii.gz", np.ones(SHAPE, np.uint8))
    store.save_label("ct_a", str(tmp_path / "l.nii.gz"), "final", {})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = store.get_dataset_archive(None)
    assert zipfile.ZipFile(path).namelist() and Path(path).parent == scratch
    os.unlink(path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(zipfile.ZipFile, "write", full)
    with pytest.raises(OSError):
        store.get_dataset_archive(None)
    assert list(scratch.iterdir()) == []


def test_a_dicom_series_over_the_budget_is_refused_from_its_headers(monkeypatch):
    from pydicom.dataset import Dataset

    from rocm_zoo.dicomweb.series_check import check_series
    from rocm_zoo.engine import volume_check

    def slice_at(z: float) -> Dataset:
        h = Dataset()
        h.Rows, h.Columns, h.NumberOfFrames = 1024, 1024, 1
        h.ImagePositionPatient, h.ImageOrientationPatient = [0, 0, z], [1, 0, 0, 0, 1, 0]
        h.SOPInstanceUID = f"1.2.{int(z)}"
        return h

    headers = [slice_at(z) for z in range(4)]
    assert check_series("s", headers) == (1024, 1024, 4)
    monkeypatch.setattr(volume_check, "_budget", VolumeBudget(max_voxels=3 * 1024 * 1024))
    with pytest.raises(UploadTooLarge, match="max_volume_voxels"):
        check_series("s", headers)
    with pytest.raises(UploadTooLarge, match="max_volume_voxels"):
        volume_check.check_dicom_budget("a session's images", headers)
