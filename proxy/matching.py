"""Match keys: what makes two requests "the same request" for replay and divergence checks.

A key keeps its parts (method, origin, path, query, headers, body) so a miss can be explained
field by field. Volatile parts are dropped by small named rules; the names appear in reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from .redact import SECRET_HEADERS, SECRET_QUERY_PARAMS
from .tapes import Request

# Headers that change from run to run without changing what is asked: credentials (every
# header the redactor treats as secret), client identity and retry bookkeeping, transport
# framing, tracing, idempotency keys.
VOLATILE_HEADERS = frozenset(SECRET_HEADERS) | {
    "user-agent",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "expect",
    "accept-encoding",
    "date",
    "traceparent",
    "tracestate",
    "baggage",
    "sentry-trace",
    "x-request-id",
    "x-client-request-id",
    "x-amzn-trace-id",
    "idempotency-key",
    "x-idempotency-key",
}
VOLATILE_HEADER_PREFIXES = ("x-stainless-", "x-datadog-", "x-b3-", ":")
# A redaction placeholder's tag depends on the machine's redaction key; its kind does not.
_PLACEHOLDER_TAG = re.compile(r"(\[REDACTED:[a-z0-9-]+):[0-9a-f]+\]")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class MatchRules:
    """What to leave out of a match key, beyond the built-in volatile headers."""

    ignore_headers: frozenset[str] = frozenset()
    ignore_json_paths: tuple[str, ...] = ()

    @classmethod
    def build(cls, headers: list[str] | tuple[str, ...] = (), json_paths=()) -> MatchRules:
        for path in json_paths:
            parse_json_path(path)  # raises ValueError for a bad path, before anything runs
        return cls(frozenset(h.lower() for h in headers), tuple(json_paths))


@dataclass(frozen=True, slots=True)
class MatchKey:
    method: str
    origin: str
    path: str
    query: tuple[tuple[str, str], ...]
    headers: tuple[tuple[str, str], ...]
    body: Any  # the canonical JSON text, or the raw bytes of a non-JSON body

    @property
    def route(self) -> tuple[str, str, str]:
        """Method, origin and path: requests on one route are candidates for 'nearest'."""
        return (self.method, self.origin, self.path)


def match_key(request: Request, rules: MatchRules) -> MatchKey:
    origin, path, query = _url_parts(request.url)
    return MatchKey(
        method=request.method.upper(),
        origin=origin,
        path=path,
        query=query,
        headers=tuple(sorted(_headers(request.headers, rules))),
        body=_canonical_body(request.body, rules),
    )


@lru_cache(maxsize=4096)
def _url_parts(url: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """Origin (with explicit port), path and sorted query: agents call few distinct URLs."""
    split = urlsplit(url)
    scheme = split.scheme.lower()
    host = (split.hostname or "").lower()
    port = split.port or _DEFAULT_PORTS.get(scheme, 0)
    return f"{scheme}://{host}:{port}", split.path or "/", tuple(sorted(_query(split.query)))


def _untagged(text: str) -> str:
    """`text` with each placeholder's machine-specific tag dropped (its kind kept)."""
    return _PLACEHOLDER_TAG.sub(r"\1]", text) if "[REDACTED:" in text else text


def parsed_body(key: MatchKey) -> Any:
    """The body as a JSON value when it is JSON, else None."""
    if isinstance(key.body, str):
        return orjson.loads(key.body)
    return None


def _query(query: str) -> list[tuple[str, str]]:
    pairs = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        # Credentials are redacted differently on every machine: only their presence counts.
        if name.lower() in SECRET_QUERY_PARAMS:
            value = "<secret>"
        pairs.append((name, _untagged(value)))
    return pairs


def keeps_header(name: str, rules: MatchRules) -> bool:
    """Whether header `name` counts in a match key."""
    lower = name.lower()
    return not (
        lower in VOLATILE_HEADERS
        or lower in rules.ignore_headers
        or lower.startswith(VOLATILE_HEADER_PREFIXES)
    )


def _headers(headers: list[tuple[str, str]], rules: MatchRules) -> list[tuple[str, str]]:
    return [
        (name.lower(), _untagged(value)) for name, value in headers if keeps_header(name, rules)
    ]


def _canonical_body(body: bytes, rules: MatchRules) -> Any:
    stripped = body.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            for path in rules.ignore_json_paths:
                value = drop_json_path(value, parse_json_path(path))
            text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
            return _untagged(text)
    return _PLACEHOLDER_TAG.sub(rb"\1]", body) if b"[REDACTED:" in body else body


# -- JSON paths: `metadata.run_id`, `messages[*].id`, `tools[0].function.description` ------

_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\*|\d+)\]")


def parse_json_path(path: str) -> tuple[str | int, ...]:
    """`messages[*].id` -> ("messages", "*", "id"); `*` matches every list element."""
    parts: list[str | int] = []
    position = 0
    for match in _PATH_PART.finditer(path):
        gap = path[position : match.start()]
        if gap not in ("", ".") or (gap == "." and not parts):
            break
        name, index = match.groups()
        parts.append(name if name is not None else ("*" if index == "*" else int(index)))
        position = match.end()
    if not parts or position != len(path):
        raise ValueError(f"not a JSON path: {path!r} (try e.g. metadata.run_id or messages[*].id)")
    return tuple(parts)


def drop_json_path(value: Any, parts: tuple[str | int, ...]) -> Any:
    """A copy of `value` without what `parts` names (absent paths change nothing)."""
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict) and isinstance(head, str) and head in value:
        if not rest:
            return {k: v for k, v in value.items() if k != head}
        return {**value, head: drop_json_path(value[head], rest)}
    if isinstance(value, list):
        if head == "*":
            if not rest:
                return []
            return [drop_json_path(item, rest) for item in value]
        if isinstance(head, int) and -len(value) <= head < len(value):
            if not rest:
                return value[:head] + value[head + 1 :]
            copy = list(value)
            copy[head] = drop_json_path(copy[head], rest)
            return copy
    return value
