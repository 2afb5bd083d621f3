"""The replayer: answers requests from a tape, and keeps what the divergence report needs.

It holds no exchange in memory: one streaming pass verifies the tape and indexes each
exchange by the digest of its match key, keeping only the record's place in the file, which
is mapped into memory and decoded when served. What it keeps per request served is constant,
so memory does not grow with the number of requests.
"""

from __future__ import annotations

import mmap
import os
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
from blake3 import blake3

from .fielddiff import FieldDiff, diff_keys
from .headlines import headline
from .matching import MatchKey, MatchRules, keeps_header, match_key, parsed_body
from .redact import Redactor
from .tapes import Exchange, Header, Request, Response, TapeReader, exchange_at

MAX_MISSES_KEPT = 200  # misses reported in detail; later ones are counted
MAX_NEAREST_CANDIDATES = 64
NOT_RETRIED_STATUS = 404


@dataclass(frozen=True, slots=True)
class Recorded:
    """Where one exchange lives in the tape."""

    seq: int
    span: tuple[int, int]
    route: tuple[str, str, str]
    method: str
    url: str


@dataclass(slots=True)
class Miss:
    position: int
    request: Request
    nearest: Recorded | None
    differences: list[FieldDiff]
    headline: str
    repeat: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "method": self.request.method,
            "url": self.request.url,
            "headline": self.headline,
            "repeat": self.repeat,
            "nearest": None
            if self.nearest is None
            else {"seq": self.nearest.seq, "method": self.nearest.method, "url": self.nearest.url},
            "differences": [d.to_json() for d in self.differences],
        }


@dataclass(slots=True)
class OutOfOrder:
    position: int
    seq: int
    after_seq: int

    def to_json(self) -> dict[str, int]:
        return {"position": self.position, "seq": self.seq, "after_seq": self.after_seq}


class Replayer:
    """Matches requests against one tape. Not thread-safe: the replay server is one loop."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        redactor: Redactor,
        rules: MatchRules | None = None,
        *,
        allow_repeats: bool = False,
        strict_order: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.redactor = redactor
        self.rules = rules or MatchRules()
        self.allow_repeats = allow_repeats
        self.strict_order = strict_order
        self.header, self._recorded = self._index()
        self.requests = 0
        self.matched = 0
        self.repeats_served = 0
        self.misses: list[Miss] = []
        self.miss_count = 0
        self.out_of_order: list[OutOfOrder] = []
        self.out_of_order_count = 0
        self._served: set[int] = set()
        self._last_seq = 0
        self._decode = lru_cache(maxsize=512)(self._decode_uncached)
        self._key = lru_cache(maxsize=1024)(self._key_uncached)

    # -- loading ------------------------------------------------------------------------

    def _index(self) -> tuple[Header, list[Recorded]]:
        """Verify the whole tape (raising TapeError) and index its exchanges by match key."""
        recorded: list[tuple[bytes, Recorded]] = []
        with TapeReader(self.path) as reader:
            for exchange in reader:
                key = match_key(exchange.request, self.rules)
                entry = Recorded(
                    exchange.seq,
                    reader.last_span,
                    key.route,
                    exchange.request.method,
                    exchange.request.url,
                )
                recorded.append((_digest(key), entry))
            header = reader.header
        with open(self.path, "rb") as file:
            self._data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        # Identical requests are served in recorded (arrival) order, not file order.
        recorded.sort(key=lambda pair: pair[1].seq)
        self._queues: dict[bytes, deque[Recorded]] = {}
        self._last: dict[bytes, Recorded] = {}
        self._routes: dict[tuple[str, str, str], list[Recorded]] = {}
        for digest, entry in recorded:
            self._queues.setdefault(digest, deque()).append(entry)
            self._last[digest] = entry
            self._routes.setdefault(entry.route, []).append(entry)
        return header, [entry for _, entry in recorded]

    # -- serving ------------------------------------------------------------------------

    def lookup(self, request: Request) -> Exchange:
        """The recorded exchange that answers `request`, or an injected miss answer."""
        self.requests += 1
        # Only what the match key keeps is redacted and keyed, and the result is remembered:
        # agents repeat requests, and redaction is the costly part of a lookup.
        kept = tuple(h for h in request.headers if keeps_header(h[0], self.rules))
        key, digest = self._key(request.method, request.url, kept, request.body)
        queue = self._queues.get(digest)
        if queue:
            entry = queue.popleft()
            self.matched += 1
            self._note_order(entry)
            return self._decode(entry.span)
        if queue is not None and self.allow_repeats:
            self.repeats_served += 1
            return self._decode(self._last[digest].span)
        redacted = Request(
            request.method, self.redactor.url(request.url), request.http_version, [], b""
        )
        miss = self._explain(redacted, key, repeat=queue is not None)
        return _miss_answer(miss, self.path)

    def _key_uncached(
        self, method: str, url: str, headers: tuple[tuple[str, str], ...], body: bytes
    ) -> tuple[MatchKey, bytes]:
        # The tape holds redacted requests, so the new one is redacted the same way.
        redacted = self.redactor.request(Request(method, url, "", list(headers), body))
        key = match_key(redacted, self.rules)
        return key, _digest(key)

    def _note_order(self, entry: Recorded) -> None:
        self._served.add(entry.seq)
        if entry.seq < self._last_seq:
            self.out_of_order_count += 1
            if len(self.out_of_order) < MAX_MISSES_KEPT:
                self.out_of_order.append(OutOfOrder(self.requests, entry.seq, self._last_seq))
        self._last_seq = max(self._last_seq, entry.seq)

    def _explain(self, request: Request, key: MatchKey, *, repeat: bool) -> Miss:
        self.miss_count += 1
        nearest, differences = self._nearest(key)
        recorded_body = None
        if nearest is not None:
            recorded_body = parsed_body(match_key(self._decode(nearest.span).request, self.rules))
        miss = Miss(
            position=self.requests,
            request=request,
            nearest=nearest,
            differences=differences,
            headline=headline(differences, recorded_body, parsed_body(key))
            if nearest is not None
            else "no recorded request to this URL",
            repeat=repeat,
        )
        if len(self.misses) < MAX_MISSES_KEPT:
            self.misses.append(miss)
        return miss

    def _nearest(self, key: MatchKey) -> tuple[Recorded | None, list[FieldDiff]]:
        """The recorded request most like `key`: same route first, fewest differing fields,
        not yet served before served, earliest first."""
        candidates = self._routes.get(key.route) or [
            r for r in self._recorded if r.route[1] == key.origin
        ]
        best: tuple[tuple[int, int, int], Recorded, list[FieldDiff]] | None = None
        for entry in candidates[:MAX_NEAREST_CANDIDATES]:
            recorded_key = match_key(self._decode(entry.span).request, self.rules)
            diffs = diff_keys(recorded_key, key)
            rank = (len(diffs), entry.seq in self._served, entry.seq)
            if best is None or rank < best[0]:
                best = (rank, entry, diffs)
        if best is None:
            return None, []
        return best[1], best[2]

    def _decode_uncached(self, span: tuple[int, int]) -> Exchange:
        return exchange_at(self._data, span)

    # -- the verdict --------------------------------------------------------------------

    def unused(self) -> list[Recorded]:
        return [r for r in self._recorded if r.seq not in self._served]

    def report(self) -> DivergenceReport:
        return DivergenceReport(
            tape=self.path,
            requests=self.requests,
            recorded=len(self._recorded),
            matched=self.matched,
            repeats_served=self.repeats_served,
            miss_count=self.miss_count,
            misses=list(self.misses),
            unused=self.unused(),
            out_of_order_count=self.out_of_order_count,
            out_of_order=list(self.out_of_order),
            strict_order=self.strict_order,
        )

    def close(self) -> None:
        self._decode.cache_clear()
        self._key.cache_clear()
        self._data.close()


@dataclass(slots=True)
class DivergenceReport:
    tape: str
    requests: int
    recorded: int
    matched: int
    repeats_served: int
    miss_count: int
    misses: list[Miss]
    unused: list[Recorded]
    out_of_order_count: int
    out_of_order: list[OutOfOrder]
    strict_order: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return bool(
            self.miss_count or self.unused or (self.strict_order and self.out_of_order_count)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tape": self.tape,
            "diverged": self.diverged,
            "summary": {
                "requests": self.requests,
                "recorded": self.recorded,
                "matched": self.matched,
                "missed": self.miss_count,
                "repeats_served": self.repeats_served,
                "unused": len(self.unused),
                "out_of_order": self.out_of_order_count,
            },
            "misses": [m.to_json() for m in self.misses],
            "unused": [{"seq": r.seq, "method": r.method, "url": r.url} for r in self.unused],
            "order": {
                "strict": self.strict_order,
                "out_of_order": [o.to_json() for o in self.out_of_order],
            },
            **self.extra,
        }

    def to_text(self) -> str:
        if not self.diverged:
            lines = [
                f"wiretape: no divergence: {self.matched} request(s) matched "
                f"{self.recorded} recorded exchange(s) of {self.tape}"
            ]
            if self.out_of_order_count:
                lines.append(
                    f"  note: {self.out_of_order_count} request(s) arrived in another order "
                    "than recorded (--strict-order makes that a divergence)"
                )
            return "\n".join(lines)
        parts = []
        if self.miss_count:
            parts.append(f"{self.miss_count} of {self.requests} request(s) had no recording")
        if self.unused:
            parts.append(f"{len(self.unused)} recorded exchange(s) never requested")
        if self.strict_order and self.out_of_order_count:
            parts.append(f"{self.out_of_order_count} request(s) out of recorded order")
        lines = [f"wiretape: DIVERGED from {self.tape}: " + "; ".join(parts)]
        for miss in self.misses:
            lines.append(f"  request {miss.position}: {miss.request.method} {miss.request.url}")
            lines.append(f"    {miss.headline}")
            if miss.nearest is not None:
                lines.append(
                    f"    nearest recorded: exchange #{miss.nearest.seq} "
                    f"{miss.nearest.method} {miss.nearest.url}"
                )
            for diff in miss.differences[:10]:
                lines.append(f"      {diff.to_text()}")
            if len(miss.differences) > 10:
                lines.append(f"      … and {len(miss.differences) - 10} more difference(s)")
        if self.miss_count > len(self.misses):
            lines.append(f"  … and {self.miss_count - len(self.misses)} more request(s)")
        for entry in self.unused[:20]:
            lines.append(f"  never requested: exchange #{entry.seq} {entry.method} {entry.url}")
        if len(self.unused) > 20:
            lines.append(f"  … and {len(self.unused) - 20} more")
        for event in self.out_of_order[:10] if self.strict_order else []:
            lines.append(
                f"  out of order: request {event.position} got exchange #{event.seq} "
                f"after #{event.after_seq}"
            )
        return "\n".join(lines)


def _digest(key: MatchKey) -> bytes:
    body = key.body if isinstance(key.body, str) else key.body.hex()
    encoded = orjson.dumps([key.method, key.origin, key.path, key.query, key.headers, body])
    return blake3(encoded).digest(length=16)


def _miss_answer(miss: Miss, tape: str) -> Exchange:
    """An answer SDKs do not retry (4xx, `x-should-retry: false`) naming what was missing."""
    message = f"wiretape: no recorded exchange in {tape} matches {miss.request.method} "
    message += f"{miss.request.url} (request {miss.position} of this run): {miss.headline}"
    error: dict[str, Any] = {
        "type": "wiretape_no_recording",
        "message": message,
        "request": miss.position,
        "headline": miss.headline,
        "nearest_seq": None if miss.nearest is None else miss.nearest.seq,
        "differences": [d.to_json() for d in miss.differences[:20]],
    }
    body = orjson.dumps({"error": error})
    return Exchange(
        seq=0,
        offset_us=0,
        source="injected",
        request=miss.request,
        response=Response(
            status=NOT_RETRIED_STATUS,
            reason="Not Found",
            http_version="HTTP/1.1",
            headers=[
                ("content-type", "application/json"),
                ("x-should-retry", "false"),
                ("x-wiretape-miss", str(miss.position)),
            ],
            body=body,
        ),
    )
