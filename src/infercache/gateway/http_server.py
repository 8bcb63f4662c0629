"""The gateway's HTTP server settings: uvicorn with httptools, and a bound on request headers.

httptools buffers a request's headers however large they are (a 32 MB header was accepted).
`BoundedHeadersProtocol` answers `431 Request Header Fields Too Large` in the OpenAI error shape
and closes the connection when a request's head passes `MAX_HEADER_BYTES` (64 KB), counted two
ways: the URL and header fields the parser handed over, summed once the head is complete
(exact), and the raw bytes read while the head is still incomplete (so a huge head is refused
after one socket read past the bound, before it is buffered whole). Body bytes read together
with the end of a head are not counted.
"""

from __future__ import annotations

from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from infercache.errors import openai_error_body

MAX_HEADER_BYTES = 64 * 1024


class BoundedHeadersProtocol(HttpToolsProtocol):
    max_header_bytes = MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0  # raw bytes read while the head is incomplete
        self._too_large = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """The parser gave up: a 400 in the OpenAI shape (uvicorn's is plain text), or the
        431 when it was our refusal of a large head."""
        if self._too_large:
            self._refuse_head()
            return
        self._answer_and_close(
            b"400 Bad Request", "the request is not valid HTTP/1.1", "invalid_http_request"
        )

    def on_headers_complete(self) -> None:
        self._in_head = False
        # Summed once here rather than counted per field: this runs on every request.
        fields = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if fields > self.max_header_bytes:
            self._too_large = True
            raise ValueError("request head too large")  # the parser stops: see below
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self._too_large or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._too_large = True
        self._answer_and_close(
            b"431 Request Header Fields Too Large",
            f"request headers over {self.max_header_bytes} bytes",
            "request_header_fields_too_large",
        )

    def _answer_and_close(self, status: bytes, message: str, code: str) -> None:
        body = orjson.dumps(
            openai_error_body(message, error_type="invalid_request_error", code=code)
        )
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\n"
            b"content-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        self.transport.close()


def server_config(app: Any, **options: Any) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for serving the gateway (the CLI and tests alike)."""
    return {"http": BoundedHeadersProtocol, "log_level": "warning", **options, "app": app}


def make_config(app: Any, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(**server_config(app, **options))
