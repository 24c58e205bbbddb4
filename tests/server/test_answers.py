"""No server path in an answer (server.http.answers), and server faults not passed off as client errors (http_errors):
units, no server."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient

from rocm_zoo.server.http import answers
from rocm_zoo.server.http import errors as http_errors

ROOT = "/srv/hospital/studies"


def test_clean_names_files_by_their_place_in_the_studies_folder():
    info = {"id": "ct_1", "path": f"{ROOT}/ct_1.nii.gz", "name": "ct_1.nii.gz", "strategy": {"random": {"ts": 1}}}
    assert answers.clean(info, (ROOT,)) == {"id": "ct_1", "name": "ct_1.nii.gz", "strategy": {"random": {"ts": 1}}}
    datalist = [{"image": f"{ROOT}/ct_1.nii.gz", "label": f"{ROOT}/labels/final/ct_1.nii.gz"}]
    assert answers.clean(datalist, (ROOT,)) == [{"image": "ct_1.nii.gz", "label": "labels/final/ct_1.nii.gz"}]
    session = {"session_id": "abc", "session_info": {"path": "/root/.cache/monailabel/sessions/abc",
                                                     "image": "/root/.cache/monailabel/sessions/abc/ct.nii.gz"}}
    assert answers.clean(session, (ROOT,)) == {"session_id": "abc", "session_info": {"image": "ct.nii.gz"}}
    # text keeps the server's own routes and URLs, loses paths
    assert answers.clean({"m": "GET /batch/infer; saved at /tmp/x/tmpab12cd34.nii.gz; see http://pacs/a/b"}) == \
        {"m": "GET /batch/infer; saved at tmpab12cd34.nii.gz; see http://pacs/a/b"}
    assert answers.clean({"route": "/infer/wholeBody_ct", "n": 3, "ok": True, "none": None}) == \
        {"route": "/infer/wholeBody_ct", "n": 3, "ok": True, "none": None}
    assert answers.clean({"p": "/datastore/../etc/shadow"}) == {"p": "shadow"}


def _app() -> FastAPI:
    def user():
        return "anyone"

    def admin():
        return "admin"

    web = FastAPI()
    router = APIRouter(prefix="/datastore")

    @router.get("/image/info")
    async def image_info(image: str, who: str = Depends(user)):
        return {"image": image, "path": f"{ROOT}/{image}.nii.gz", "who": who}

    web.include_router(router)

    @web.get("/list")
    def listing(limit: Optional[int] = None, who: str = Depends(user)):
        return [{"image": f"{ROOT}/a.nii.gz", "who": who, "limit": limit}]

    @web.get("/ready")
    async def ready():
        return JSONResponse({"file": "/opt/app/model/x.pt"}, status_code=503, headers={"Retry-After": "5"})

    @web.get("/log")
    async def log():
        return Response(f"saved {ROOT}/labels/final/a.nii.gz\n", media_type="text/plain")

    @web.get("/raw")
    async def raw():
        return Response(b"\x00binary", media_type="application/octet-stream")

    web.dependency_overrides[user] = admin  # as log-in overrides MONAI Label's get_current_user
    answers.install(web, lambda: (ROOT,))
    return web


def test_every_route_answers_without_paths_and_keeps_its_dependencies():
    client = TestClient(_app())
    assert client.get("/datastore/image/info", params={"image": "ct_1"}).json() == {"image": "ct_1", "who": "admin"}
    assert client.get("/list", params={"limit": 2}).json() == [{"image": "a.nii.gz", "who": "admin", "limit": 2}]
    r = client.get("/ready")
    assert (r.status_code, r.json(), r.headers["retry-after"]) == (503, {"file": "x.pt"}, "5")
    assert client.get("/log").text == "saved labels/final/a.nii.gz\n"
    assert client.get("/raw").content == b"\x00binary"
    assert client.get("/list", params={"limit": "x"}).status_code == 422  # parameters are still checked


def _raises_in(filename: str, exc: Exception):
    """A function whose frame is in `filename`, raising `exc` (as MONAI Label's own code would)."""
    scope: dict = {}
    exec(compile("def boom(e):\n    raise e\n", filename, "exec"), scope)
    return lambda: scope["boom"](exc)


def test_only_errors_raised_where_the_request_is_read_are_client_errors():
    import monailabel

    ml = monailabel.__path__[0]
    web = FastAPI()
    cases = {
        "/endpoint-value": (f"{ml}/endpoints/activelearning.py", AttributeError("'list' has no attribute 'get'"), 422),
        "/deep-value": ("/opt/venv/site-packages/monai/transforms/io.py", ValueError("bad shape"), 500),
        "/ours-type": ("/opt/rocm_zoo/server/tasks/bundle.py", TypeError("bug"), 500),
        "/datastore-assert": (f"{ml}/datastore/local.py", AssertionError("nothing to include"), 422),
        "/model-assert": ("/opt/venv/site-packages/monai/networks/nets/x.py", AssertionError(""), 500),
        "/datastore-missing": (f"{ml}/datastore/local.py", FileNotFoundError(2, "No such file", "/srv/x"), 404),
        "/bundle-missing": ("/opt/rocm_zoo/engine/pool.py", FileNotFoundError(2, "No such file", "/srv/m.pt"), 500),
        "/program-missing": ("/usr/lib/python3.11/subprocess.py", FileNotFoundError(2, "No such file", "x"), 500),
    }
    for path, (filename, exc, _) in cases.items():
        web.add_api_route(path, _raises_in(filename, exc))
    http_errors.install(web)
    client = TestClient(web, raise_server_exceptions=False)
    for path, (_, _, status) in cases.items():
        r = client.get(path)
        assert r.status_code == status, (path, r.status_code, r.text)
        assert "/srv/" not in r.text
