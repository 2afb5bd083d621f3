"""Find what still looks secret on a tape: `wiretape verify --secrets`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .redact import PLACEHOLDER, SECRET_HEADERS, scan_for_secrets
from .tapes import Exchange, TapeReader


@dataclass(frozen=True, slots=True)
class Leak:
    seq: int
    field: str
    kind: str
    preview: str

    def to_text(self, path: str) -> str:
        return f"{path}: exchange #{self.seq} {self.field}: {self.kind} {self.preview}"


def find_leaks(path: str, extra_patterns: Sequence[str] = ()) -> Iterator[Leak]:
    """Every secret-shaped thing in the tape at `path`, exchange by exchange (streaming).

    Raises TapeError for a tape that is not intact: a tape is scanned only once it verifies.
    """
    with TapeReader(path) as reader:
        for exchange in reader:
            yield from _exchange_leaks(exchange, extra_patterns)


def _exchange_leaks(exchange: Exchange, extra: Sequence[str]) -> Iterator[Leak]:
    for field, data in _fields(exchange):
        for finding in scan_for_secrets(data, extra):
            yield Leak(exchange.seq, field, finding.kind, finding.preview)
    sides = [("request", exchange.request.headers)]
    if exchange.response is not None:
        sides.append(("response", exchange.response.headers))
    for side, headers in sides:
        for name, value in headers:
            # A credential header is secret whatever its value looks like, unless redacted.
            if name.lower() in SECRET_HEADERS and not PLACEHOLDER.search(value.encode("latin-1")):
                yield Leak(exchange.seq, f"{side}.headers.{name}", "secret-header", "(value)")


def _fields(exchange: Exchange) -> Iterator[tuple[str, bytes]]:
    request, response = exchange.request, exchange.response
    yield "request.url", request.url.encode()
    for name, value in request.headers:
        yield f"request.headers.{name}", value.encode("latin-1")
    yield "request.body", request.body
    if response is not None:
        for name, value in response.headers + (response.trailers or []):
            yield f"response.headers.{name}", value.encode("latin-1")
        # Scanned joined: a secret split across chunks is still a secret on disk.
        yield "response.body", response.content
