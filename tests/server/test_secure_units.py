"""Issue 15 without a server: which images a request may name, messages without server paths, atomic datastore
writes and recovery after a crash, label checks, the user file and tokens, the auth mode, the new --conf keys."""

from __future__ import annotations

import json
import os
import time

import jwt
import nibabel as nib
import numpy as np
import pytest

from rocm_zoo.app.config import AppConfig
from rocm_zoo.errors import ConfigError, ImageNotFound, InvalidRequest
from rocm_zoo.server.auth import bind_host, decide, is_loopback, tokens
from rocm_zoo.server.auth.users import UserFile, monailabel_roles
from rocm_zoo.server.http import access
from rocm_zoo.server.store.datastore import PARTIAL, CheckedLocalDatastore
from rocm_zoo.server.store.uploads import check_label

AFFINE = np.array([[-2.0, 0, 0, 10], [0, -2.5, 0, -4], [0, 0, 3.0, 7], [0, 0, 0, 1]])


def _nii(path, array, affine=AFFINE):
    nib.save(nib.Nifti1Image(array, affine), str(path))
    return str(path)


@pytest.fixture
def store(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    for name in ("ct_a", "ct_b"):
        _nii(studies / f"{name}.nii.gz", np.zeros((12, 10, 6), np.int16))
    return CheckedLocalDatastore(str(studies), extensions=("*.nii.gz", "*.nrrd"))


# --- only the datastore ---------------------------------------------------------------------------------------------

def test_a_server_path_is_not_an_image(store, tmp_path):
    outside = _nii(tmp_path / "outside.nii.gz", np.zeros((4, 4, 4), np.int16))
    for image in (outside, "/etc/passwd", "../studies/ct_a.nii.gz", str(tmp_path / "studies" / "ct_a.nii.gz")):
        with pytest.raises(ImageNotFound) as e:
            access.check_image(image, store, allow_local_paths=False)
        assert str(tmp_path) not in str(e.value) and "/etc" not in str(e.value), e.value
    access.check_image("ct_a", store, allow_local_paths=False)
    access.check_image(outside, store, allow_local_paths=True)  # a single-user workstation
    with pytest.raises(ImageNotFound):
        access.check_image("/etc/no-such-file", store, allow_local_paths=True)
    with pytest.raises(InvalidRequest):
        access.check_image("", store, allow_local_paths=False)


def test_batch_ids_must_be_datastore_ids(store):
    assert access.check_ids(["ct_a", "ct_b"], store) == ["ct_a", "ct_b"]
    with pytest.raises(ImageNotFound, match="2 of image_ids"):
        access.check_ids(["ct_a", "/etc/passwd", "nope"], store)
    for bad in ("ct_a", {"a": 1}, [1, 2], [""]):
        with pytest.raises(InvalidRequest):
            access.check_ids(bad, store)


def test_an_upload_temp_file_is_accepted_only_by_its_shape(tmp_path):
    import tempfile

    path = tempfile.NamedTemporaryFile(suffix=".nii.gz").name
    open(path, "wb").close()
    try:
        assert access.is_upload_temp(path)
    finally:
        os.remove(path)
    assert not access.is_upload_temp(path)  # gone
    assert not access.is_upload_temp("/etc/passwd")
    named = tmp_path / "tmpabcdefgh.nii.gz"
    named.write_bytes(b"")
    assert not access.is_upload_temp(str(named))  # right name, wrong folder


def test_messages_never_show_server_paths():
    msg = access.redact("Cannot read '/srv/data/studies/ct_a.nii.gz' (see /var/log/x.log) at http://pacs:8042/dicom-web/x")
    assert msg == "Cannot read 'ct_a.nii.gz' (see x.log) at http://pacs:8042/dicom-web/x", msg
    assert access.shown("x" * 500).endswith("...") and len(access.shown("x" * 500)) == 80


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 201, "a\\b"])
def test_ids_and_tags_are_plain_names(name):
    with pytest.raises(InvalidRequest):
        access.check_name(name, "label tag")


# --- labels: checked, atomic, recoverable -----------------------------------------------------------------------------

def test_label_checks(tmp_path, store):
    image = store.get_image_uri("ct_a")
    check_label(_nii(tmp_path / "ok.nii.gz", np.ones((12, 10, 6), np.uint8)), image)
    check_label(_nii(tmp_path / "ok_float.nii.gz", np.ones((12, 10, 6), np.float32)), image)
    cases = {
        "size": _nii(tmp_path / "size.nii.gz", np.ones((12, 10, 5), np.uint8)),
        "spacing": _nii(tmp_path / "spacing.nii.gz", np.ones((12, 10, 6), np.uint8), AFFINE @ np.diag([2, 1, 1, 1])),
        "origin": _nii(tmp_path / "origin.nii.gz", np.ones((12, 10, 6), np.uint8),
                       AFFINE + np.array([[0, 0, 0, 5.0], [0] * 4, [0] * 4, [0] * 4])),
        "non-integer": _nii(tmp_path / "frac.nii.gz", np.full((12, 10, 6), 0.5, np.float32)),
        "negative": _nii(tmp_path / "neg.nii.gz", np.full((12, 10, 6), -1, np.int16)),
        "4D": _nii(tmp_path / "four.nii.gz", np.ones((12, 10, 6, 2), np.uint8)),
    }
    (tmp_path / "junk.nii.gz").write_bytes(b"not a volume")
    cases["unreadable"] = str(tmp_path / "junk.nii.gz")
    for why, path in cases.items():
        with pytest.raises(InvalidRequest):
            check_label(path, image)
            pytest.fail(f"a label with a wrong {why} was accepted")


def test_label_save_is_atomic_and_indexed_last(tmp_path, store):
    label = _nii(tmp_path / "l.nii.gz", np.ones((12, 10, 6), np.uint8))
    store.save_label("ct_a", label, "final", {})
    final = tmp_path / "studies" / "labels" / "final"
    assert (final / "ct_a.nii.gz").exists() and not list(final.glob(f".*{PARTIAL}*"))
    index = json.loads((tmp_path / "studies" / "datastore_v2.json").read_text())
    assert "final" in index["objects"]["ct_a"]["labels"]
    with pytest.raises(InvalidRequest):  # a wrong label leaves the stored one untouched
        store.save_label("ct_a", _nii(tmp_path / "bad.nii.gz", np.ones((3, 3, 3), np.uint8)), "final", {})
    assert np.asarray(nib.load(str(final / "ct_a.nii.gz")).dataobj).sum() == 12 * 10 * 6
    with pytest.raises(InvalidRequest):
        store.save_label("ct_a", label, "../../escape", {})
    assert not (tmp_path / "escape").exists()


def test_a_crash_mid_save_leaves_a_consistent_datastore(tmp_path, store):
    """What kill -9 can leave: a temporary label file, a label renamed into place but not yet in the index, and
    (from a server before this change) a torn index. The next start removes the first, adopts the second and
    rebuilds the third from the files."""
    studies = tmp_path / "studies"
    _nii(tmp_path / "l.nii.gz", np.ones((12, 10, 6), np.uint8))
    store.save_label("ct_a", str(tmp_path / "l.nii.gz"), "final", {})
    orig = studies / "labels" / "original"
    leftover = orig / f".ct_a.nii.gz{PARTIAL}x1y2"
    leftover.write_bytes(b"\x1f\x8b half a label")
    os.utime(leftover, (time.time() - 3600, time.time() - 3600))  # written by the server before the crash
    in_progress = orig / f".ct_b.nii.gz{PARTIAL}z3w4"  # a save of this process, under way while it reconciles
    in_progress.write_bytes(b"\x1f\x8b being written")
    _nii(orig / "ct_b.nii.gz", np.ones((12, 10, 6), np.uint8))  # renamed into place, index not yet written
    (studies / "datastore_v2.json").write_text('{"name": "new-dataset", "objects": {"ct_a": {"ima')  # torn
    reopened = CheckedLocalDatastore(str(studies), extensions=("*.nii.gz",))
    assert list(orig.glob(f".*{PARTIAL}*")) == [in_progress]
    in_progress.unlink()
    assert sorted(reopened.list_images()) == ["ct_a", "ct_b"]
    assert reopened.get_label_by_image_id("ct_a", "final") and reopened.get_label_by_image_id("ct_b", "original")
    assert json.loads((studies / "datastore_v2.json").read_text())["objects"]  # a whole index again
    assert list(studies.glob("datastore_v2.json.unreadable-*"))  # the torn one kept aside, not deleted


def test_an_uploaded_image_is_checked_and_named_safely(tmp_path, store):
    good = _nii(tmp_path / "new.nii.gz", np.zeros((8, 8, 8), np.int16))
    assert store.add_image("ct_new", good, {}) == "ct_new"
    with pytest.raises(InvalidRequest):
        store.add_image("../../evil", good, {})
    (tmp_path / "bad.nii.gz").write_bytes(b"garbage")
    with pytest.raises(InvalidRequest):
        store.add_image("ct_bad", str(tmp_path / "bad.nii.gz"), {})
    assert "ct_bad" not in store.list_images() and not (tmp_path / "evil.nii.gz").exists()


# --- users, tokens, auth mode, config --------------------------------------------------------------------------------

def test_user_file(tmp_path):
    users = UserFile(tmp_path / "users.json")
    users.add("ann", "annotator", "correct horse")
    assert oct((tmp_path / "users.json").stat().st_mode & 0o777) == "0o600"
    assert "correct horse" not in (tmp_path / "users.json").read_text()
    assert users.check("ann", "correct horse").role == "annotator"
    assert users.check("ann", "wrong horse!") is None and users.check("nobody", "correct horse") is None
    for bad in (("ann", "annotator", "another pw"), ("x y", "admin", "password1"), ("bob", "root", "password1"),
                ("bob", "admin", "short")):
        with pytest.raises(InvalidRequest):
            users.add(*bad)
    users.add("ann", "reviewer", "new password", replace=True)
    assert users.check("ann", "new password").role == "reviewer"
    assert UserFile(tmp_path / "users.json").get("ann").role == "reviewer"  # another process sees it
    assert users.remove("ann") and users.get("ann") is None and not users.remove("ann")


def test_tokens_expire_and_are_signed(tmp_path):
    secret = tokens.load_secret(tmp_path / "s")
    assert tokens.load_secret(tmp_path / "s") == secret and len(secret) == 32
    roles = monailabel_roles("reviewer")
    claims = tokens.verify(secret, tokens.issue(secret, "ann", roles, hours=1))
    assert claims["preferred_username"] == "ann" and claims["realm_access"]["roles"] == roles
    with pytest.raises(jwt.ExpiredSignatureError):
        tokens.verify(secret, tokens.issue(secret, "ann", roles, hours=1, now=time.time() - 7200))
    with pytest.raises(jwt.InvalidSignatureError):
        tokens.verify(b"x" * 32, tokens.issue(secret, "ann", roles, hours=1))
    forged = jwt.encode({"sub": "ann", "iss": "rocm_zoo", "iat": 0, "exp": 2**40}, None, algorithm="none")
    with pytest.raises(jwt.InvalidTokenError):
        tokens.verify(secret, forged)


def test_roles_nest():
    assert set(monailabel_roles("annotator")) < set(monailabel_roles("reviewer")) < set(monailabel_roles("admin"))


def test_auth_is_on_beyond_loopback():
    assert bind_host(["x", "start_server", "--host", "127.0.0.1"]) == "127.0.0.1"
    assert bind_host(["x", "start_server", "-i", "10.0.0.5"]) == "10.0.0.5"
    assert bind_host(["x", "start_server", "--host=::1"]) == "::1"
    assert bind_host(["x", "start_server"]) == "0.0.0.0"  # MONAI Label's own default
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("myhost")
    assert decide("auto", "127.0.0.1", keycloak=False) == "off"
    assert decide("auto", "0.0.0.0", keycloak=False) == "local"
    assert decide("on", "127.0.0.1", keycloak=False) == "local"
    assert decide("off", "0.0.0.0", keycloak=False) == "off"
    assert decide("auto", "0.0.0.0", keycloak=True) == "keycloak"


def test_new_conf_keys():
    c = AppConfig.from_conf({})
    assert (c.allow_local_paths, c.auth, c.cors_origins, c.max_upload_mb) == (False, "auto", (), 2048.0)
    c = AppConfig.from_conf({"allow_local_paths": "true", "max_upload_mb": "64", "auth": "on",
                             "cors_origins": "https://viewer.example:3000, http://10.0.0.2"})
    assert c.allow_local_paths and c.max_upload_mb == 64 and c.auth == "on"
    assert c.cors_origins == ("https://viewer.example:3000", "http://10.0.0.2")
    for key, value in (("cors_origins", "*"), ("cors_origins", "viewer.example"), ("max_upload_mb", "0"),
                       ("auth", "maybe"), ("allow_local_paths", "perhaps")):
        with pytest.raises(ConfigError):
            AppConfig.from_conf({key: value})


# --- error answers: the reason, never a server path or a trace --------------------------------------------------------

def test_error_answers_have_no_paths_or_traces():
    from fastapi import FastAPI, HTTPException
    from fastapi.testclient import TestClient

    from rocm_zoo.errors import InvalidRequest
    from rocm_zoo.server.http import errors as http_errors

    app = FastAPI()
    raised = {
        "/rocm": InvalidRequest("Image '/srv/secret/studies/ct_a.nii.gz' cannot be read: bad gzip"),
        "/unexpected": RuntimeError("boom at /srv/secret/internal.py"),
        "/missing": FileNotFoundError(2, "No such file or directory", "/srv/secret/x"),
        "/client500": HTTPException(status_code=500, detail="Neither Image nor File not Session ID input is provided"),
    }
    for path, exc in raised.items():
        app.add_api_route(path, (lambda e: (lambda: (_ for _ in ()).throw(e)))(exc))
    http_errors.install(app)
    client = TestClient(app, raise_server_exceptions=False)
    # a missing file the server itself opens (here: raised in the test) is a server fault, not a client's 404
    expected = {"/rocm": 422, "/unexpected": 500, "/missing": 500, "/client500": 422}
    for path, status in expected.items():
        r = client.get(path)
        assert r.status_code == status, (path, r.status_code, r.text)
        assert "/srv/secret" not in r.text and "Traceback" not in r.text, r.text
    assert "ct_a.nii.gz" in client.get("/rocm").json()["detail"]  # the reason stays, with the file name


def test_messages_keep_the_servers_own_routes():
    msg = access.redact("batch b1 is still running; GET /batch/infer for its progress, DELETE /batch/infer to stop it")
    assert "GET /batch/infer" in msg and "DELETE /batch/infer" in msg
    assert access.redact("/datastore/../etc/shadow") == "shadow"
