"""On loopback, only requests addressed to this machine, and only from it.

A web page on evil.example whose name the attacker re-points at 127.0.0.1 (DNS rebinding) makes the browser send
`Host: evil.example` to this server, with the page's script reading the answers: the browser's same-origin rule does
not stop it. While the server listens on loopback only, `HostCheck` answers 421 unless the `Host` header names this
machine (localhost, 127.0.0.0/8, ::1, with or without a port) or a name of `--conf allowed_hosts` (a reverse proxy
on this machine that passes its own name on). When log-in is off because the server listens on loopback, a request
from any other address is refused too (403): log-in must not be off for a socket that someone else can reach.
"""

from __future__ import annotations

import ipaddress
import json
import logging

from rocm_zoo.server.auth.binding import is_loopback
from rocm_zoo.server.http.access import shown

logger = logging.getLogger(__name__)


def host_name(header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case ("" when malformed)."""
    value = (header or "").strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1:] and not value[end + 1:].startswith(":")):
            return ""
        return value[1:end]
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return ""
    return name.rstrip(".")


def names_this_machine(header: str, allowed: tuple[str, ...] = ()) -> bool:
    name = host_name(header)
    if not name:
        return False
    if name in allowed:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return is_loopback(name)


class HostCheck:
    """ASGI middleware: 421 for a Host that is not this machine; with `loopback_clients_only`, 403 for a client
    address beyond loopback."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] = (), loopback_clients_only: bool = False):
        self.app = app
        self.allowed = tuple(h.lower() for h in allowed_hosts)
        self.loopback_clients_only = loopback_clients_only

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        client = (scope.get("client") or ("", 0))[0]
        if self.loopback_clients_only and client and not is_loopback(client):
            return await self._refuse(scope, send, 403, f"This server listens on loopback with log-in off and "
                                      f"serves this machine only; {client} is not it. Serve beyond loopback with "
                                      "log-in on (see 'On a hospital network')")
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
        if not names_this_machine(host, self.allowed):
            return await self._refuse(scope, send, 421, f"This server answers requests addressed to this machine "
                                      f"only (Host: localhost or 127.0.0.1), not to '{shown(host, 60)}'; a name "
                                      "that should reach it goes in --conf allowed_hosts")
        return await self.app(scope, receive, send)

    async def _refuse(self, scope, send, status: int, reason: str) -> None:
        logger.warning("%s %s from %s -> %d: %s", scope.get("method", "WS"), scope.get("path", ""),
                       (scope.get("client") or ("?",))[0], status, reason)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install(app, allowed_hosts: tuple[str, ...], loopback_clients_only: bool) -> None:
    """Outermost, like uploads.BodyLimit: Starlette builds its middleware stack again at the next request."""
    from starlette.middleware import Middleware

    app.user_middleware.insert(0, Middleware(HostCheck, allowed_hosts=tuple(allowed_hosts),
                                             loopback_clients_only=loopback_clients_only))
    app.middleware_stack = None
