"""A local HTTP server for the download tests: one payload at one path, as a file server answers (``Range``
requests resumed with 206, a start past the end answered 416 with the payload's size), ``/<code>`` answered with that
HTTP error, any other path 404; every request recorded as ``(path, Range header)``."""
import contextlib
import http.server
import threading
from typing import Iterator, List, Optional, Tuple

__all__ = ["PayloadServer", "serve_payload"]


class PayloadServer:
    """What :func:`serve_payload` yields: the server's ``url`` and the ``hits`` it answered so far."""

    def __init__(self, url: str, hits: List[Tuple[str, Optional[str]]]):
        self.url, self.hits = url, hits

    def ranges(self, path: str) -> List[Optional[str]]:
        """The ``Range`` header of every request of ``path`` (``None``: the whole file), in order."""
        return [rng for hit, rng in self.hits if hit == path]


def _handler(path: str, payload: bytes, hits: List[Tuple[str, Optional[str]]]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server naming
            rng = self.headers.get("Range")
            hits.append((self.path, rng))
            if self.path != path:
                code = self.path.strip("/")
                self.send_error(int(code) if code.isdigit() else 404)
                return
            start = int(rng.split("=")[1].split("-")[0]) if rng else 0
            if start >= len(payload):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(payload)}")
                self.end_headers()
                return
            body = payload[start:]
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@contextlib.contextmanager
def serve_payload(path: str, payload: bytes) -> Iterator[PayloadServer]:
    """Serve ``payload`` at ``path`` (``"/data.zip"``) on a free local port inside the block."""
    hits: List[Tuple[str, Optional[str]]] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(path, payload, hits))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield PayloadServer(f"http://127.0.0.1:{httpd.server_address[1]}", hits)
    finally:
        httpd.shutdown()
        httpd.server_close()
