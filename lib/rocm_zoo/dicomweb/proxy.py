"""`/proxy/dicom/*`: the viewer's DICOMweb calls (OHIF's QIDO, WADO, STOW), passed on to the PACS the server's studies
are, in place of MONAI Label's route.

MONAI Label 0.8.5 answers these with a blocking `requests` call made on the event loop, without a timeout: a PACS that
hangs stops every route of the server, `/health/live` included. Here the call awaits (httpx, the event loop stays free),
has the PACS's connect and read timeouts (`--conf pacs_connect_timeout_s`, `pacs_read_timeout_s`), streams the answer
through instead of holding it whole, and a PACS that hangs or refuses is a 504 or a 503 with the reason. Also unlike
MONAI Label's: the viewer's own headers (its bearer token for this server, its Host) never reach the PACS, only
`Accept`, `Accept-Encoding` and, for STOW, `Content-Type`; the query string is passed on (MONAI Label drops it); paths
with `.` or `..` segments are refused, so no call reaches the PACS's other APIs; POST is taken for STOW only.
Same paths and role as MONAI Label's (any logged-in user).

When the studies are a folder, there is no PACS: the same paths answer OHIF's reads from the local datastore
(`local_series`), so the viewer works out of the box; STOW is refused (a viewer saves labels through
`/datastore/label`).
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator, Optional
from urllib.parse import quote

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from monailabel.config import settings
from monailabel.endpoints.user.auth import RBAC, User
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from rocm_zoo.dicomweb.local_series import LocalDicomWeb, multipart_frame
from rocm_zoo.dicomweb.pacs_http import PacsTimeouts, describe
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.errors import ImageNotFound, InvalidRequest, PacsUnavailable

logger = logging.getLogger(__name__)

PREFIX = "/proxy/dicom"
# Calls to the PACS in flight at once; one more waits up to POOL_WAIT_S for a connection, then gets a 503.
MAX_CONNECTIONS = 32
POOL_WAIT_S = 5.0
FORWARDED_REQUEST_HEADERS = ("accept", "accept-encoding", "content-type")
# Hop-by-hop headers (RFC 9110 7.6.1), and the PACS's cookies, which are not this server's to set.
DROPPED_RESPONSE_HEADERS = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                            "transfer-encoding", "upgrade", "set-cookie"}
_SAFE_PATH = "/:@!$&'()*+,;=-._~"


class DicomProxy:
    def __init__(self, studies: str, timeouts: PacsTimeouts, local: Optional[LocalDicomWeb] = None):
        self.base_url = studies.rstrip("/")
        self.is_pacs = studies.startswith(("http://", "https://"))
        self.timeouts = timeouts
        self.local = local
        self._client: Optional[httpx.AsyncClient] = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:  # made on the event loop that uses it
            auth = None
            if settings.MONAI_LABEL_DICOMWEB_USERNAME and settings.MONAI_LABEL_DICOMWEB_PASSWORD:
                auth = (settings.MONAI_LABEL_DICOMWEB_USERNAME, settings.MONAI_LABEL_DICOMWEB_PASSWORD)
            self._client = httpx.AsyncClient(
                auth=auth, follow_redirects=False,
                timeout=httpx.Timeout(connect=self.timeouts.connect_s, read=self.timeouts.read_s,
                                      write=self.timeouts.read_s, pool=POOL_WAIT_S),
                limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=8))
        return self._client

    def url(self, op: str, path: str, query: str) -> str:
        if not self.is_pacs:
            raise HTTPException(status_code=404, detail="This server's studies are a folder, not a DICOMweb PACS: "
                                                        "there is nothing to proxy")
        segments = path.replace("\\", "/").split("/")
        if any(s in (".", "..") for s in segments):
            raise InvalidRequest("A DICOMweb path has no '.' or '..' segments")
        prefix = {"wado": settings.MONAI_LABEL_WADO_PREFIX, "qido": settings.MONAI_LABEL_QIDO_PREFIX,
                  "stow": settings.MONAI_LABEL_STOW_PREFIX}.get(op, "")
        if op == "qido" and path.endswith("metadata"):  # some OHIF versions ask QIDO for metadata (as MONAI Label)
            prefix = settings.MONAI_LABEL_WADO_PREFIX
        target = "/".join(p.strip("/") for p in (prefix or "", quote(path, safe=_SAFE_PATH)) if p.strip("/"))
        return f"{self.base_url}/{target}" + (f"?{query}" if query else "")

    async def forward(self, request: Request, op: str, path: str) -> Response:
        if not self.is_pacs and self.local is not None:
            return await run_in_threadpool(local_answer, self.local, request.method, op, path,
                                           dict(request.query_params))
        url = self.url(op, path, request.url.query)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS}
        headers.setdefault("accept-encoding", "identity")
        headers.update(await _google_auth(self.base_url))
        body = await request.body() if request.method == "POST" else None
        client = self.client()
        try:
            upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body),
                                         stream=True)
        except httpx.PoolTimeout as e:
            raise PacsUnavailable(f"{MAX_CONNECTIONS} calls to the PACS at {self.base_url} are in flight and none "
                                  f"ended within {POOL_WAIT_S:g} s; try again shortly") from e
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise describe(self.base_url, e, self.timeouts.connect_s, self.timeouts.read_s) from e
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED_RESPONSE_HEADERS}
        return StreamingResponse(self._body(upstream, url), status_code=upstream.status_code, headers=kept,
                                 background=BackgroundTask(upstream.aclose))

    async def _body(self, upstream: httpx.Response, url: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except (httpx.TimeoutException, httpx.TransportError) as e:
            # The status is sent: the viewer sees a cut answer (shorter than its Content-Length, or an unended chunk).
            logger.warning("proxy: the PACS stopped answering %s mid-answer: %s", url.split("?")[0], first_line(e))


def local_answer(local: LocalDicomWeb, method: str, op: str, path: str, query: dict[str, str]) -> Response:
    """OHIF's DICOMweb read of the local datastore: QIDO-RS searches, WADO-RS metadata and frames."""
    if op == "stow" or method != "GET":
        raise InvalidRequest("This server's studies are a folder, not a PACS: nothing is stored through DICOMweb "
                             "(a viewer saves labels through /datastore/label)")
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidRequest("A DICOMweb path has no '.' or '..' segments")
    match parts:
        case ["studies"]:
            answer = local.search_studies(query)
        case ["studies", study, "series"]:
            answer = local.search_series(study)
        case ["studies", study, "metadata"]:
            answer = local.study_metadata(study)
        case ["studies", study, "series", series, "instances"]:
            answer = local.search_instances(study, series)
        case ["studies", study, "series", series, "metadata"]:
            answer = local.series_metadata(study, series)
        case ["studies", study, "series", series, "instances", sop, "metadata"]:
            answer = [i for i in local.series_metadata(study, series) if i["00080018"]["Value"] == [sop]]
            if not answer:
                raise ImageNotFound(f"No instance {sop[:64]} in series {series[:64]}")
        case ["studies", study, "series", series, "instances", sop, "frames", number] if number.isdigit():
            body, media_type = multipart_frame(local.frame(study, series, sop, int(number)))
            return Response(body, media_type=media_type)
        case _:
            raise ImageNotFound(f"{PREFIX}/{op + '/' if op else ''}{'/'.join(parts)[:120]} is not a DICOMweb read "
                                "this server answers for its local studies (QIDO-RS search, WADO-RS metadata and "
                                "frames)")
    return Response(json.dumps(answer), media_type="application/dicom+json")


async def _google_auth(base_url: str) -> dict[str, str]:
    """A Google Cloud Healthcare DICOMweb store (as MONAI Label): a bearer token of the default credentials."""
    if "googleapis.com" not in base_url:
        return {}

    def token() -> str:
        import google.auth
        import google.auth.transport.requests

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        credentials.refresh(google.auth.transport.requests.Request())
        return credentials.token

    return {"Authorization": f"Bearer {await run_in_threadpool(token)}"}


def install(web: FastAPI, studies: str, timeouts: PacsTimeouts, local: Optional[LocalDicomWeb] = None) -> DicomProxy:
    """Our `/proxy/dicom/...` routes; MONAI Label's are removed by `rocm_zoo.server.http.routes.install`. `local`
    answers them when the studies are a folder."""
    proxy = DicomProxy(studies, timeouts, local)
    user_role = RBAC(settings.MONAI_LABEL_AUTH_ROLE_USER)

    def route(op: str):
        async def forward(request: Request, path: str, user: User = Depends(user_role)):
            return await proxy.forward(request, op, path)

        return forward

    # The bare prefix last: it also matches the three others.
    for op, methods in (("wado", ["GET"]), ("qido", ["GET"]), ("stow", ["GET", "POST"]), ("", ["GET"])):
        web.add_api_route(f"{PREFIX}/{op}/{{path:path}}".replace("//", "/"), route(op), methods=methods,
                          include_in_schema=False, name=f"proxy_{op or 'dicom'}")
    return proxy
