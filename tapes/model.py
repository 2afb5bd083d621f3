"""The records of a tape as Python values, and their mapping to and from JSON objects.

`to_record` builds the JSON object in the format's fixed key order; `from_record` checks a
parsed object strictly and raises `RecordError` naming the field at fault.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

FORMAT_NAME = "wiretape"
FORMAT_VERSION = 1
HASH_ALGORITHM = "blake3"
SOURCES = ("live", "injected")
ERROR_KINDS = ("refused", "dns", "tls", "timeout", "reset", "protocol", "aborted", "other")

Headers = list[tuple[str, str]]


class RecordError(ValueError):
    """A parsed record does not have the shape the format requires."""


@dataclass(slots=True)
class Header:
    """The first record: what wrote the tape and under which redaction policy."""

    created: str
    wiretape: str
    redaction: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    hash_algorithm: str = HASH_ALGORITHM


@dataclass(slots=True)
class Chunk:
    """One block of a streamed body, as it arrived, `at_us` after the request arrived."""

    at_us: int
    data: bytes


@dataclass(slots=True)
class Request:
    method: str
    url: str
    http_version: str
    headers: Headers
    body: bytes


@dataclass(slots=True)
class Response:
    """A response: `body` when it was read whole, `chunks` when it was streamed."""

    status: int
    reason: str
    http_version: str
    headers: Headers
    body: bytes | None = None
    chunks: list[Chunk] | None = None
    trailers: Headers | None = None

    @property
    def streamed(self) -> bool:
        return self.chunks is not None

    @property
    def content(self) -> bytes:
        if self.chunks is not None:
            return b"".join(chunk.data for chunk in self.chunks)
        return self.body or b""


@dataclass(slots=True)
class UpstreamError:
    """Why the upstream did not deliver a whole response; `after_chunks` blocks did arrive."""

    kind: str
    message: str
    after_chunks: int = 0


@dataclass(slots=True)
class Timings:
    """Microseconds from the request's arrival to the response head and to the end."""

    headers_us: int | None = None
    done_us: int | None = None


@dataclass(slots=True)
class Exchange:
    """One request and what came back: a response, an upstream error, or both (a cut stream)."""

    seq: int
    offset_us: int
    request: Request
    response: Response | None
    error: UpstreamError | None = None
    timings: Timings = field(default_factory=Timings)
    source: str = "live"


@dataclass(slots=True)
class Seal:
    """The end record. `recovered` is set when `verify --repair` sealed a cut tape."""

    exchanges: int
    final_hash: str
    ended: str
    recovered: dict[str, Any] | None = None


def check_exchange(exchange: Exchange) -> None:
    """Raise ValueError if `exchange` breaks a rule of the format that its types allow."""
    if exchange.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {exchange.source!r}")
    if exchange.error is not None and exchange.error.kind not in ERROR_KINDS:
        raise ValueError(f"error kind must be one of {ERROR_KINDS}, not {exchange.error.kind!r}")
    response = exchange.response
    if response is not None and (response.body is None) == (response.chunks is None):
        raise ValueError("a response needs exactly one of body and chunks")


# -- to JSON objects ------------------------------------------------------------------------


def payload(data: bytes) -> dict[str, str]:
    """Bytes as `{"text": ...}` when they are UTF-8, else `{"base64": ...}`."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def header_record(header: Header) -> dict[str, Any]:
    return {
        "type": "header",
        "format": FORMAT_NAME,
        "version": header.version,
        "created": header.created,
        "wiretape": header.wiretape,
        "hash_algorithm": header.hash_algorithm,
        "redaction": header.redaction,
        "meta": header.meta,
    }


def exchange_record(exchange: Exchange) -> dict[str, Any]:
    request, response, error = exchange.request, exchange.response, exchange.error
    return {
        "type": "exchange",
        "seq": exchange.seq,
        "offset_us": exchange.offset_us,
        "source": exchange.source,
        "request": {
            "method": request.method,
            "url": request.url,
            "http_version": request.http_version,
            "headers": request.headers,
            "body": payload(request.body),
        },
        "response": None
        if response is None
        else {
            "status": response.status,
            "reason": response.reason,
            "http_version": response.http_version,
            "headers": response.headers,
            "body": None if response.body is None else payload(response.body),
            "chunks": None
            if response.chunks is None
            else [{"at_us": c.at_us, **payload(c.data)} for c in response.chunks],
            "trailers": response.trailers,
        },
        "error": None
        if error is None
        else {"kind": error.kind, "message": error.message, "after_chunks": error.after_chunks},
        "timings": {"headers_us": exchange.timings.headers_us, "done_us": exchange.timings.done_us},
    }


def seal_record(seal: Seal) -> dict[str, Any]:
    return {
        "type": "end",
        "exchanges": seal.exchanges,
        "final_hash": seal.final_hash,
        "ended": seal.ended,
        "recovered": seal.recovered,
    }


# -- from JSON objects ----------------------------------------------------------------------


def header_from_record(record: dict[str, Any]) -> Header:
    return Header(
        version=_get(record, "version", int),
        created=_get(record, "created", str),
        wiretape=_get(record, "wiretape", str),
        hash_algorithm=_get(record, "hash_algorithm", str),
        redaction=_get(record, "redaction", dict),
        meta=_get(record, "meta", dict),
    )


def exchange_from_record(record: dict[str, Any]) -> Exchange:
    """Decode an exchange record, or raise `RecordError` naming the field at fault."""
    try:
        return _exchange_fast(record)
    except _Unusual:
        return _exchange_checked(record)


class _Unusual(Exception):
    """The fast decoder met something it does not vouch for: the checked one decides."""


def _exchange_fast(record: dict[str, Any]) -> Exchange:
    # Verify spends most of its time here, so the common shape is decoded with inline type
    # checks; anything unexpected goes to `_exchange_checked`, which words the error. Every
    # check below is at least as strict as the checked decoder's.
    try:
        req, resp, err, timings = (
            record["request"],
            record["response"],
            record["error"],
            record["timings"],
        )
        seq, offset_us, source = record["seq"], record["offset_us"], record["source"]
        method, url, version = req["method"], req["url"], req["http_version"]
        headers_us, done_us = timings["headers_us"], timings["done_us"]
        if not (
            type(seq) is int
            and type(offset_us) is int
            and source in SOURCES
            and type(method) is str
            and type(url) is str
            and type(version) is str
            and (headers_us is None or type(headers_us) is int)
            and (done_us is None or type(done_us) is int)
            and err is None
        ):
            raise _Unusual
        request = Request(method, url, version, _fast_headers(req["headers"]), _fast(req["body"]))
        response = None if resp is None else _fast_response(resp)
    except (KeyError, TypeError):
        raise _Unusual from None
    return Exchange(seq, offset_us, request, response, None, Timings(headers_us, done_us), source)


def _fast_response(resp: dict[str, Any]) -> Response:
    status, reason, version = resp["status"], resp["reason"], resp["http_version"]
    body, chunks, trailers = resp["body"], resp["chunks"], resp["trailers"]
    if not (
        type(status) is int
        and type(reason) is str
        and type(version) is str
        and (body is None) != (chunks is None)
        and trailers is None
    ):
        raise _Unusual
    decoded_chunks = None
    if chunks is not None:
        if type(chunks) is not list:
            raise _Unusual
        decoded_chunks = []
        for chunk in chunks:
            at_us = chunk["at_us"]
            if type(at_us) is not int:
                raise _Unusual
            decoded_chunks.append(Chunk(at_us, _fast(chunk)))
    return Response(
        status,
        reason,
        version,
        _fast_headers(resp["headers"]),
        None if body is None else _fast(body),
        decoded_chunks,
    )


def _fast_headers(pairs: Any) -> Headers:
    if type(pairs) is not list:
        raise _Unusual
    out = []
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            raise _Unusual
        name, value = pair
        if type(name) is not str or type(value) is not str:
            raise _Unusual
        out.append((name, value))
    return out


def _fast(payload: Any) -> bytes:
    """A text payload; base64 and anything odd go the checked way."""
    if type(payload) is not dict or "base64" in payload:
        raise _Unusual
    text = payload.get("text")
    if type(text) is not str:
        raise _Unusual
    return text.encode("utf-8")


def _exchange_checked(record: dict[str, Any]) -> Exchange:
    req = _get(record, "request", dict)
    resp = _get(record, "response", dict, nullable=True)
    err = _get(record, "error", dict, nullable=True)
    timings = _get(record, "timings", dict)
    source = _get(record, "source", str)
    if source not in SOURCES:
        raise RecordError(f"source: unknown value {source!r}")
    return Exchange(
        seq=_get(record, "seq", int),
        offset_us=_get(record, "offset_us", int),
        source=source,
        request=Request(
            method=_get(req, "method", str, "request."),
            url=_get(req, "url", str, "request."),
            http_version=_get(req, "http_version", str, "request."),
            headers=_headers(req, "headers", "request."),
            body=_payload(_get(req, "body", dict, "request."), "request.body"),
        ),
        response=None if resp is None else _response(resp),
        error=None if err is None else _error(err),
        timings=Timings(
            headers_us=_get(timings, "headers_us", int, "timings.", nullable=True),
            done_us=_get(timings, "done_us", int, "timings.", nullable=True),
        ),
    )


def seal_from_record(record: dict[str, Any]) -> Seal:
    return Seal(
        exchanges=_get(record, "exchanges", int),
        final_hash=_get(record, "final_hash", str),
        ended=_get(record, "ended", str),
        recovered=_get(record, "recovered", dict, nullable=True),
    )


def _response(resp: dict[str, Any]) -> Response:
    body = _get(resp, "body", dict, "response.", nullable=True)
    chunks = _get(resp, "chunks", list, "response.", nullable=True)
    if (body is None) == (chunks is None):
        raise RecordError("response: exactly one of body and chunks must be set")
    return Response(
        status=_get(resp, "status", int, "response."),
        reason=_get(resp, "reason", str, "response."),
        http_version=_get(resp, "http_version", str, "response."),
        headers=_headers(resp, "headers", "response."),
        body=None if body is None else _payload(body, "response.body"),
        chunks=None if chunks is None else [_chunk(c, i) for i, c in enumerate(chunks)],
        trailers=_headers(resp, "trailers", "response.", nullable=True),
    )


def _error(err: dict[str, Any]) -> UpstreamError:
    kind = _get(err, "kind", str, "error.")
    if kind not in ERROR_KINDS:
        raise RecordError(f"error.kind: unknown value {kind!r}")
    return UpstreamError(
        kind=kind,
        message=_get(err, "message", str, "error."),
        after_chunks=_get(err, "after_chunks", int, "error."),
    )


def _chunk(chunk: object, index: int) -> Chunk:
    where = f"response.chunks[{index}]"
    if not isinstance(chunk, dict):
        raise RecordError(f"{where}: expected an object")
    return Chunk(at_us=_get(chunk, "at_us", int, where + "."), data=_payload(chunk, where))


def _payload(obj: dict[str, Any], where: str) -> bytes:
    text = obj.get("text")
    if isinstance(text, str) and "base64" not in obj:
        return text.encode("utf-8")
    encoded = obj.get("base64")
    if isinstance(encoded, str) and "text" not in obj:
        try:
            return base64.b64decode(encoded, validate=True)
        except ValueError as exc:  # binascii.Error, or non-ASCII text
            raise RecordError(f"{where}.base64: not valid base64 ({exc})") from None
    raise RecordError(f"{where}: expected exactly one of a string text or base64")


def _headers(obj: dict[str, Any], key: str, prefix: str, nullable: bool = False) -> Headers | None:
    value = _get(obj, key, list, prefix, nullable=nullable)
    if value is None:
        return None
    for pair in value:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
        ):
            raise RecordError(f"{prefix}{key}: expected [name, value] string pairs")
    return [(name, val) for name, val in value]


def _get(obj: dict[str, Any], key: str, kind: type, prefix: str = "", nullable: bool = False):
    try:
        value = obj[key]
    except KeyError:
        raise RecordError(f"{prefix}{key}: missing") from None
    if value is None and nullable:
        return None
    # bool is an int to Python but not to the format.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecordError(f"{prefix}{key}: expected {_KIND_NAMES[kind]}, found {value!r:.40}")
    return value


_KIND_NAMES = {int: "an integer", str: "a string", dict: "an object", list: "an array"}
