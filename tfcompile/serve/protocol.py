"""uvicorn's httptools protocol with the request head bounded and every refusal in JSON.

httptools buffers a request line and its headers whole, however long, and joining a long header's
pieces costs time quadratic in its length, on the event loop: one client sending a 20 MB header
stalls every other. Here a head may hold ``max_bytes`` and must arrive within ``timeout_s`` of its
first byte (or of the connection opening), else the connection is answered 431 or 408 and closed; a
body must keep arriving, no ``timeout_s`` without a byte of it, and once ``timeout_s`` has passed at
MIN_BODY_RATE on average, else 408 (a stalled body was held for ever, and kept every batch waiting
for it as a request arriving; one trickled a byte a second held its connection as long, and a few
hundred of them every descriptor of the process and its shutdown); a request that is not HTTP
gets uvicorn's 400, and one whose method the parser does not know (FOO, or get in lower case) 501
(RFC 9110, 9.1), in the route family's JSON shape.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any, ClassVar

from httptools import HttpParserInvalidMethodError
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from tfcompile.serve.app import REFUSED, error_body

# A request line's method and target (RFC 9110's token, then a space): what a request of a method
# the parser does not know begins with, where bytes that are not HTTP (TLS, say) do not.
REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) (\S{0,2048})")
MIN_BODY_RATE = 240  # bytes/s a body averages past its first timeout_s (ASP.NET Kestrel's default)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Made for a server by ``bounded``, which gives it its bounds."""

    max_bytes: ClassVar[int]  # the request line and headers
    timeout_s: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_left: int | None = self.max_bytes  # bytes the head may still take; None in a body
        self.timer: asyncio.TimerHandle | None = None
        self.piece = b""  # the bytes last fed to the parser, while no request has ended in them
        self.body_began = 0.0  # the loop's time at the head's end
        self.body_bytes = 0  # received since

    @classmethod
    def bounded(cls, max_bytes: int, timeout_s: float) -> type[BoundedHttpToolsProtocol]:
        """The protocol with these bounds (uvicorn builds one per connection from the class)."""
        return type(cls.__name__, (cls,), {"max_bytes": max_bytes, "timeout_s": timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._untime()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feeds the parser no more of a head than it may hold: what follows the head's end (a
        body, the next request) is fed on, with a new allowance for each new head. Each piece of a
        body restarts its clock, and is refused where the body is arriving too slowly."""
        if self.head_left is None:
            elapsed = self.loop.time() - self.body_began
            if elapsed > self.timeout_s and self.body_bytes < MIN_BODY_RATE * elapsed:
                rate = self.body_bytes / elapsed
                message = f"the request body is arriving at {rate:.0f} bytes/s, under {MIN_BODY_RATE} bytes/s"
                return self._refuse(408, message)
            if self.timer is not None:
                self._time(self._body_late)
        while data and not self.transport.is_closing():
            if self.head_left == 0:
                self._refuse(431, f"the request line and headers are over {self.max_bytes:,} bytes")
                return
            size = len(data) if self.head_left is None else self.head_left
            piece, data = data[:size], data[size:]
            if self.head_left is not None:
                self.head_left -= len(piece)
            self.piece = piece
            super().data_received(piece)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._time_head()

    def on_headers_complete(self) -> None:
        self.head_left = None
        self.body_began, self.body_bytes = self.loop.time(), 0
        self._time(self._body_late)  # until the message completes: at once where it has no body
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)  # this message's alone (a piece may end its head, or begin the next)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._untime()
        self.head_left = self.max_bytes  # the next request's head
        self.piece = b""  # what follows in the piece is another request, which need not begin it

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes the parser refused, called where it catches the parser's error."""
        line = REQUEST_LINE.match(self.piece)
        if isinstance(sys.exc_info()[1], HttpParserInvalidMethodError) and line:
            method, path = (part.decode("latin-1") for part in line.groups())
            message = f"the method {method} is not one this server knows: its routes take GET, HEAD and POST"
            return self._refuse(501, message, path, "not_implemented")
        self._refuse(400, f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})")

    def _time_head(self) -> None:
        self._time(self._head_late)

    def _time(self, late: Any) -> None:
        """``late`` called after timeout_s, unless the clock is restarted or stopped first."""
        self._untime()
        self.timer = self.loop.call_later(self.timeout_s, late)

    def _untime(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_late(self) -> None:
        if self.head_left is not None and not self.transport.is_closing():
            self._refuse(408, f"the request line and headers took over {self.timeout_s:g} s to arrive")

    def _body_late(self) -> None:
        if self.head_left is None and not self.transport.is_closing():
            self._refuse(408, f"the request body stopped arriving: no byte of it for {self.timeout_s:g} s")

    def _refuse(
        self, status: int, message: str, path: str | None = None, code: str = "bad_http_request"
    ) -> None:
        """Answer ``status`` in JSON and close the connection (the parser cannot go on)."""
        path = getattr(self, "url", b"").decode("latin-1") if path is None else path
        body = json.dumps(error_body(path, status, message, code)).encode()
        head = [STATUS_LINE[status]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        if self.head_left is None and (cycle := getattr(self, "cycle", None)) is not None:
            cycle.scope[REFUSED] = status  # the request's own answer, whatever its routes make of it
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        self._untime()
