"""One line about one exchange: what `inspect` tabulates and `record` prints as it goes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from .tapes import Exchange


@dataclass(slots=True)
class ExchangeSummary:
    seq: int
    method: str
    url: str
    host: str
    path: str
    status: int | None
    error: str | None
    duration_ms: float | None
    streamed: bool
    chunks: int | None
    request_bytes: int
    response_bytes: int
    offset_ms: float
    source: str

    @property
    def outcome(self) -> str:
        """The status, the error kind, or both for a stream cut short."""
        parts = [str(self.status)] if self.status is not None else []
        if self.error:
            parts.append(self.error)
        return " ".join(parts) or "-"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(exchange: Exchange) -> ExchangeSummary:
    response = exchange.response
    try:
        split = urlsplit(exchange.request.url)
        host, path = split.netloc, (split.path or "/") + ("?" + split.query if split.query else "")
    except ValueError:  # a URL the tape holds but urllib cannot split: show it whole
        host, path = "", exchange.request.url
    done = exchange.timings.done_us
    return ExchangeSummary(
        seq=exchange.seq,
        method=exchange.request.method,
        url=exchange.request.url,
        host=host,
        path=path,
        status=response.status if response else None,
        error=exchange.error.kind if exchange.error else None,
        duration_ms=None if done is None else round(done / 1000, 3),
        streamed=bool(response and response.streamed),
        chunks=len(response.chunks) if response and response.chunks is not None else None,
        request_bytes=len(exchange.request.body),
        response_bytes=len(response.content) if response else 0,
        offset_ms=round(exchange.offset_us / 1000, 3),
        source=exchange.source,
    )


def format_line(summary: ExchangeSummary) -> str:
    """`#3 POST api.openai.com/v1/chat/completions 200 412.3ms 57 chunks`."""
    parts = [
        f"#{summary.seq}",
        summary.method,
        summary.host + summary.path,
        summary.outcome,
        _duration(summary.duration_ms),
    ]
    if summary.chunks is not None:
        parts.append(f"{summary.chunks} chunk{'' if summary.chunks == 1 else 's'}")
    return " ".join(parts)


def format_table(summaries: list[ExchangeSummary]) -> str:
    head = ("SEQ", "METHOD", "HOST AND PATH", "STATUS", "DURATION", "CHUNKS", "BYTES")
    rows = [
        (
            str(s.seq),
            s.method,
            _shorten(s.host + s.path, 60),
            s.outcome,
            _duration(s.duration_ms),
            "-" if s.chunks is None else str(s.chunks),
            str(s.response_bytes),
        )
        for s in summaries
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    right = {0, 4, 5, 6}
    lines = [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in [head, *rows]
    ]
    return "\n".join(lines)


def _duration(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f}ms"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
