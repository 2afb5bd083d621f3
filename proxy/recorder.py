"""The recorder: a mitmproxy addon that writes every exchange to a tape as it completes.

Responses pass through as they arrive (`flow.response.stream`), never buffered whole; each
block is captured with its arrival time. A response whose length was not announced up front
is stored as chunks, one with a Content-Length as a body. Each exchange is redacted whole
before it reaches the tape writer, which hashes and writes it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mitmproxy import http
from mitmproxy.net import encoding

from .redact import Redactor
from .tapes import (
    Chunk,
    Exchange,
    Request,
    Response,
    TapeWriter,
    Timings,
    UpstreamError,
)
from .upstream_errors import classify_error

ExchangeListener = Callable[[Exchange], None]


@dataclass(slots=True)
class _Flight:
    """What is known of an exchange while it is under way."""

    seq: int
    offset_us: int
    started: float
    request: Request | None = None
    headers_us: int | None = None
    chunks: list[Chunk] = field(default_factory=list)

    def elapsed_us(self) -> int:
        return int((time.monotonic() - self.started) * 1_000_000)

    def capture(self, data: bytes) -> bytes:
        # mitmproxy calls this with each block as it arrives, and with b"" at the end.
        if data:
            self.chunks.append(Chunk(self.elapsed_us(), data))
        return data


class Recorder:
    """Records flows to `writer`, redacted by `redactor`; tells `on_exchange` of each one."""

    def __init__(
        self,
        writer: TapeWriter,
        redactor: Redactor,
        on_exchange: ExchangeListener | None = None,
    ) -> None:
        self.writer = writer
        self.redactor = redactor
        self.on_exchange = on_exchange
        self._seq = itertools.count(1)
        self._flights: dict[str, _Flight] = {}

    # -- mitmproxy hooks, in the order they fire ------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._flights[flow.id] = _Flight(
            seq=next(self._seq), offset_us=self.writer.offset_us(), started=time.monotonic()
        )

    def request(self, flow: http.HTTPFlow) -> None:
        flight = self._flights.get(flow.id)
        if flight is None:
            return
        req = flow.request
        flight.request = Request(
            method=req.method,
            url=req.url,
            http_version=req.http_version,
            headers=_header_pairs(req.headers),
            body=req.raw_content or b"",
        )
        # Ask for an uncompressed answer, so the tape is readable and redaction sees every
        # byte. The tape keeps the client's own request headers, captured just above.
        if "accept-encoding" in req.headers:
            req.headers["accept-encoding"] = "identity"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        flight = self._flights.get(flow.id)
        if flight is None or flow.response is None:
            return
        flight.headers_us = flight.elapsed_us()
        flow.response.stream = flight.capture

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        flight = self._flights.get(flow.id)
        if flight is None or flow.error is None:
            return
        message = flow.error.msg
        self._finish(flow, UpstreamError(classify_error(message), message, len(flight.chunks)))
        # Without this mitmproxy answers a failed connection with its own 502 page, which
        # SDKs retry as a server error; closing the connection is what the client would
        # have seen going direct.
        if flow.response is None and flow.killable:
            flow.kill()

    def done(self) -> None:
        """The proxy is stopping: exchanges still under way are recorded as aborted."""
        for flow_id in list(self._flights):
            flight = self._flights.pop(flow_id)
            if flight.request is not None:
                error = UpstreamError(
                    "aborted", "wiretape stopped mid-exchange", len(flight.chunks)
                )
                self._write(flight, None, error)

    # -- helpers --------------------------------------------------------------------------

    def _finish(self, flow: http.HTTPFlow, error: UpstreamError | None) -> None:
        flight = self._flights.pop(flow.id, None)
        if flight is None or flight.request is None:
            return
        response = None if flow.response is None else self._response(flow.response, flight)
        self._write(flight, response, error)

    def _write(
        self, flight: _Flight, response: Response | None, error: UpstreamError | None
    ) -> None:
        assert flight.request is not None
        exchange = Exchange(
            seq=flight.seq,
            offset_us=flight.offset_us,
            request=flight.request,
            response=response,
            error=error,
            timings=Timings(flight.headers_us, flight.elapsed_us()),
        )
        redacted = self.redactor.exchange(exchange)
        self.writer.append(redacted)
        if self.on_exchange is not None:
            self.on_exchange(redacted)

    def _response(self, resp: http.Response, flight: _Flight) -> Response:
        headers = _header_pairs(resp.headers)
        trailers = _header_pairs(resp.trailers) if resp.trailers else None
        coding = resp.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            # The upstream compressed despite being asked not to. Store the decoded body so
            # redaction can see it; the client already got the original bytes.
            body = encoding.decode(b"".join(c.data for c in flight.chunks), coding)
            headers = [
                (name, str(len(body)) if name.lower() == "content-length" else value)
                for name, value in headers
                if name.lower() not in ("content-encoding", "transfer-encoding")
            ]
            if not any(name.lower() == "content-length" for name, _ in headers):
                headers.append(("content-length", str(len(body))))
            return self._built(resp, headers, trailers, body=body)
        if "content-length" in resp.headers:
            return self._built(
                resp, headers, trailers, body=b"".join(c.data for c in flight.chunks)
            )
        return self._built(resp, headers, trailers, chunks=flight.chunks)

    def _built(self, resp, headers, trailers, *, body=None, chunks=None) -> Response:
        return Response(
            status=resp.status_code,
            reason=resp.reason,
            http_version=resp.http_version,
            headers=headers,
            body=body,
            chunks=chunks,
            trailers=trailers,
        )


def _header_pairs(headers: http.Headers) -> list[tuple[str, str]]:
    # Latin-1 maps each byte to one code point, so any header bytes survive the round trip.
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.fields]
