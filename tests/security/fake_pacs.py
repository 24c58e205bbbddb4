"""A stand-in DICOMweb PACS on 127.0.0.1 for the tests of a broken neighbour: it answers every GET with an empty
listing (`[]`), or accepts and never answers (`hang`), or is gone (`refuse`: its port closed). It records what it was
asked: path, query and headers."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Asked:
    path: str
    headers: dict


class FakePacs:
    def __init__(self):
        self.mode = "answer"
        self.asked: list[Asked] = []
        self.hung = 0  # requests held without an answer
        self._release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake.asked.append(Asked(self.path, {k.lower(): v for k, v in self.headers.items()}))
                if fake.mode == "hang":
                    fake.hung += 1
                    fake._release.wait(120)
                    return
                body = b"[]"
                self.send_response(200)
                self.send_header("Content-Type", "application/dicom+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/dicom-web"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def hang(self) -> None:
        self.mode = "hang"

    def refuse(self) -> None:
        """Closes the port: a connection is refused from now on."""
        self.mode = "refuse"
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def stop(self) -> None:
        if self.mode != "refuse":
            self.refuse()
