"""`--on-miss forward`: send a request the tape lacks upstream, and record it on a new tape.

This is the replay side's only code path to the network, and it exists only when the user
asks for it; nothing imports this module otherwise.
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx

from .redact import Redactor
from .tapes import Chunk, Exchange, Request, Response, TapeWriter, Timings, UpstreamError
from .upstream_errors import classify_error

# Not forwarded: they describe the client's connection to wiretape, not the request.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
TIMEOUT = httpx.Timeout(connect=30, read=600, write=60, pool=30)


class Forwarder:
    def __init__(
        self,
        writer: TapeWriter,
        redactor: Redactor,
        *,
        upstream_ca: Path | None = None,
        insecure: bool = False,
    ) -> None:
        self.writer = writer
        self.redactor = redactor
        self._seq = 0
        verify: ssl.SSLContext | bool = False
        if not insecure:
            verify = ssl.create_default_context()
            import certifi

            verify.load_verify_locations(certifi.where())
            if upstream_ca is not None:
                verify.load_verify_locations(str(upstream_ca))
        self._client = httpx.AsyncClient(verify=verify, timeout=TIMEOUT, follow_redirects=False)
        self._client.headers.clear()  # send the client's headers, not httpx's defaults

    async def forward(self, request: Request) -> Exchange:
        """Answer `request` from upstream; the tape gets it redacted, the client as it is."""
        self._seq += 1
        offset_us = self.writer.offset_us()
        started = time.monotonic()
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_BY_HOP]
        headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"]
        headers.append(("accept-encoding", "identity"))  # as the recorder asks: readable tapes
        chunks: list[Chunk] = []
        response: Response | None = None
        error: UpstreamError | None = None
        headers_us = None
        try:
            outgoing = self._client.build_request(
                request.method, request.url, headers=headers, content=request.body
            )
            answer = await self._client.send(outgoing, stream=True)
            headers_us = _since(started)
            try:
                async for data in answer.aiter_raw():
                    chunks.append(Chunk(_since(started), data))
            finally:
                await answer.aclose()
            response = _response(answer, chunks)
        except httpx.HTTPError as exc:
            message = str(exc) or type(exc).__name__
            error = UpstreamError(classify_error(message), message, len(chunks))
        exchange = Exchange(
            seq=self._seq,
            offset_us=offset_us,
            request=request,
            response=response,
            error=error,
            timings=Timings(headers_us, _since(started)),
        )
        self.writer.append(self.redactor.exchange(exchange))
        return exchange

    async def close(self) -> None:
        await self._client.aclose()
        self.writer.close()


def _response(answer: httpx.Response, chunks: list[Chunk]) -> Response:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.headers.raw]
    streamed = "content-length" not in answer.headers
    return Response(
        status=answer.status_code,
        reason=answer.reason_phrase,
        http_version=answer.http_version,
        headers=headers,
        body=None if streamed else b"".join(c.data for c in chunks),
        chunks=chunks if streamed else None,
    )


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1_000_000)
