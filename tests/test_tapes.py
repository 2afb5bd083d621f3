"""The tape format's proof: round trips, tamper and truncation detection, repair, the writer."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wiretape.tapes import (
    FORMAT_VERSION,
    FSYNC_POLICIES,
    BrokenChainError,
    Chunk,
    Exchange,
    NotATapeError,
    Request,
    Response,
    TapeError,
    TapeExistsError,
    TapeFormatError,
    TapeReader,
    TapeWriter,
    Timings,
    TruncatedTapeError,
    UnknownVersionError,
    UpstreamError,
    load_tape,
    repair_tape,
    verify_tape,
)
from wiretape.tapes import writer as tape_writer
from wiretape.tapes.chain import GENESIS, frame, unframe
from wiretape.tapes.model import ERROR_KINDS, Header, exchange_record, header_record

REDACTION = {"headers": ["authorization", "x-api-key"], "json_paths": []}
HEX_DIGITS = b"0123456789abcdef"


# -- building tapes ---------------------------------------------------------------------------


def json_request(body: bytes, url: str = "https://api.example.com/v1/chat/completions") -> Request:
    headers = [("content-type", "application/json"), ("accept", "text/event-stream")]
    return Request("POST", url, "HTTP/1.1", headers, body)


def sample_exchanges() -> list[Exchange]:
    """Three exchanges that touch every part of a record: whole, streamed, cut by an error."""
    whole = Exchange(
        seq=0,
        offset_us=1_200,
        request=json_request(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'),
        response=Response(
            200, "OK", "HTTP/1.1", [("content-type", "application/json")], body=b'{"ok":true}'
        ),
        timings=Timings(headers_us=310, done_us=420),
    )
    streamed = Exchange(
        seq=1,
        offset_us=9_500,
        request=json_request(b'{"stream":true}'),
        response=Response(
            200,
            "OK",
            "HTTP/1.1",
            [("content-type", "text/event-stream"), ("set-cookie", "a=1"), ("set-cookie", "b=2")],
            chunks=[Chunk(15, b"data: {}\n\n"), Chunk(40, b"\xff\x00\xfe")],
            trailers=[("x-checksum", "abc")],
        ),
        timings=Timings(headers_us=12, done_us=55),
    )
    cut = Exchange(
        seq=2,
        offset_us=20_000,
        request=json_request(b""),
        response=Response(200, "OK", "HTTP/2", [], chunks=[Chunk(7, b"data: 1\n\n")]),
        error=UpstreamError("reset", "connection reset by peer", after_chunks=1),
        source="injected",
    )
    return [whole, streamed, cut]


def write_tape(path: Path, exchanges: list[Exchange], fsync: str = "never") -> TapeWriter:
    with TapeWriter(path, redaction=REDACTION, meta={"test": True}, fsync=fsync) as writer:
        for exchange in exchanges:
            writer.append(exchange)
    return writer


def sample_tape(path: Path) -> bytes:
    write_tape(path, sample_exchanges())
    return path.read_bytes()


def line_ends(data: bytes) -> list[int]:
    """The offset just after each newline: where each whole line ends."""
    return [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]


def seal(exchanges: int, final_hash: str | None = None) -> dict[str, Any]:
    """An end record; `final_hash=None` is filled in with the chain head when it is framed."""
    return {
        "type": "end",
        "exchanges": exchanges,
        "final_hash": final_hash,
        "ended": "2025-01-01T00:00:00.000Z",
        "recovered": None,
    }


class RawLine(bytes):
    """A line written exactly as given, without framing, and not advancing the chain."""


def chained(items: list[dict[str, Any] | bytes]) -> bytes:
    """Frame records (dicts) or canonical bytes into correctly chained lines."""
    previous, out = GENESIS, bytearray()
    for item in items:
        if isinstance(item, RawLine):
            out += item
            continue
        if isinstance(item, dict) and item.get("type") == "end" and item["final_hash"] is None:
            item = {**item, "final_hash": previous.hex()}
        canonical = orjson.dumps(item) if isinstance(item, dict) else item
        parts, previous = frame(canonical, previous)
        out += b"".join(parts)
    return bytes(out)


def header_rec(**changes: Any) -> dict[str, Any]:
    record = header_record(Header(created="2025-01-01T00:00:00.000Z", wiretape="0", redaction={}))
    return {**record, **changes}


def exchange_recs() -> list[dict[str, Any]]:
    return [exchange_record(exchange) for exchange in sample_exchanges()]


def verify_bytes(path: Path, data: bytes) -> Any:
    path.write_bytes(data)
    return verify_tape(path)


class Scratch:
    """One file rewritten in place, thousands of times: replacing it instead costs far more
    (ext4 flushes a file that was truncated on open when it is closed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def holding(self, data: bytes) -> Path:
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        return self.path

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def scratch(tmp_path):
    file = Scratch(tmp_path / "scratch.tape")
    yield file
    file.close()


# -- 1. round trips ---------------------------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
AWKWARD = st.sampled_from(
    ["", "\x00", "\u2028", "\u2029", '"', "\\", "\n", "\r\n", "\t", "\x1f\x7f", "\ufeff", "é", "😀"]
)
TEXTS = st.one_of(TEXT, st.lists(st.one_of(AWKWARD, TEXT), max_size=6).map("".join))
BODIES = st.one_of(
    st.binary(max_size=120),
    TEXTS.map(str.encode),
    # valid UTF-8 with one stray byte, and an encoded surrogate: must go as base64
    TEXTS.map(lambda text: text.encode() + b"\xff"),
    st.just(b"\xed\xa0\x80"),
)
INTS = st.integers(min_value=0, max_value=2**63 - 1)
HEADER_NAMES = st.one_of(st.sampled_from(["set-cookie", "Set-Cookie", "x-a", "via"]), TEXT)
HEADERS = st.lists(st.tuples(HEADER_NAMES, TEXTS), max_size=6)
HTTP_VERSIONS = st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/3"])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3),
    max_leaves=8,
)
JSON_OBJECTS = st.dictionaries(TEXTS, JSON_VALUES, max_size=4)


@st.composite
def responses(draw: st.DrawFn) -> Response:
    streamed = draw(st.booleans())
    chunks = st.lists(st.builds(Chunk, at_us=INTS, data=BODIES), max_size=5)
    return Response(
        status=draw(st.integers(min_value=100, max_value=599)),
        reason=draw(TEXTS),
        http_version=draw(HTTP_VERSIONS),
        headers=draw(HEADERS),
        body=None if streamed else draw(BODIES),
        chunks=draw(chunks) if streamed else None,
        trailers=draw(st.none() | HEADERS),
    )


@st.composite
def exchange_lists(draw: st.DrawFn) -> list[Exchange]:
    seqs = draw(st.lists(INTS, unique=True, max_size=5))
    return [
        Exchange(
            seq=seq,
            offset_us=draw(INTS),
            request=Request(
                draw(TEXT), draw(TEXTS), draw(HTTP_VERSIONS), draw(HEADERS), draw(BODIES)
            ),
            response=draw(st.none() | responses()),
            error=draw(
                st.none()
                | st.builds(UpstreamError, st.sampled_from(ERROR_KINDS), TEXTS, st.integers(0, 99))
            ),
            timings=Timings(draw(st.none() | INTS), draw(st.none() | INTS)),
            source=draw(st.sampled_from(["live", "injected"])),
        )
        for seq in seqs
    ]


def exchange_canonicals(path: Path) -> list[bytes]:
    lines = path.read_bytes().splitlines()[1:-1]
    return [unframe(line)[0] for line in lines]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exchanges=exchange_lists(), meta=JSON_OBJECTS, redaction=JSON_OBJECTS)
def test_any_exchanges_round_trip_byte_exact(
    exchanges: list[Exchange], meta: dict[str, Any], redaction: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "t.tape")
        with TapeWriter(path, redaction=redaction, meta=meta, fsync="never") as writer:
            for exchange in exchanges:
                writer.append(exchange)
        tape = load_tape(path)
        assert tape.header == writer.header
        assert tape.exchanges == exchanges
        assert tape.seal.exchanges == len(exchanges)
        assert tape.seal.recovered is None
        with TapeReader(path) as reader:
            assert list(reader) == exchanges
        # Writing what was read gives the same canonical bytes: the encoding is a fixed point.
        again = Path(tmp, "again.tape")
        write_tape(again, tape.exchanges)
        assert exchange_canonicals(again) == exchange_canonicals(path)


def test_empty_bodies_chunk_lists_and_trailers_stay_distinct_from_missing_ones(tmp_path):
    exchanges = [
        Exchange(0, 0, json_request(b""), Response(204, "", "HTTP/1.1", [], body=b"")),
        Exchange(1, 0, json_request(b""), Response(200, "OK", "HTTP/1.1", [], chunks=[])),
        Exchange(2, 0, json_request(b""), Response(200, "OK", "HTTP/1.1", [], b"", trailers=[])),
        Exchange(3, 0, json_request(b""), None, UpstreamError("refused", "", 0)),
        Exchange(4, 0, json_request(b""), Response(200, "", "", [], chunks=[Chunk(0, b"")])),
    ]
    write_tape(tmp_path / "t.tape", exchanges)
    loaded = load_tape(tmp_path / "t.tape").exchanges
    assert loaded == exchanges
    assert loaded[0].response.body == b"" and loaded[0].response.chunks is None
    assert loaded[1].response.chunks == [] and loaded[1].response.body is None
    assert loaded[2].response.trailers == [] and loaded[0].response.trailers is None


def test_tape_with_no_exchanges_round_trips(tmp_path):
    write_tape(tmp_path / "t.tape", [])
    tape = load_tape(tmp_path / "t.tape")
    assert tape.exchanges == [] and tape.seal.exchanges == 0
    assert len(tmp_path.joinpath("t.tape").read_bytes().splitlines()) == 2


def test_binary_bodies_that_are_not_utf8_round_trip_as_base64(tmp_path):
    bodies = [bytes(range(256)), b"\xc0\x80", b"\xed\xa0\x80", b"ok\xff", b"\x80"]
    exchanges = [
        Exchange(i, 0, json_request(body), Response(200, "OK", "HTTP/1.1", [], body=body))
        for i, body in enumerate(bodies)
    ]
    write_tape(tmp_path / "t.tape", exchanges)
    assert load_tape(tmp_path / "t.tape").exchanges == exchanges
    for line in tmp_path.joinpath("t.tape").read_bytes().splitlines()[1:-1]:
        assert orjson.loads(line)["request"]["body"].keys() == {"base64"}


def test_unicode_that_needs_escaping_round_trips_and_stays_on_one_line(tmp_path):
    text = 'nul\x00 ls\u2028 ps\u2029 quote" back\\ nl\n cr\r tab\t bom\ufeff 😀 é \x1f\x7f'
    body = text.encode()
    response = Response(200, text, "HTTP/1.1", [(text, text)], chunks=[Chunk(1, body)])
    exchange = Exchange(0, 0, Request(text, text, "HTTP/1.1", [(text, text)], body), response)
    write_tape(tmp_path / "t.tape", [exchange])
    data = tmp_path.joinpath("t.tape").read_bytes()
    assert data.count(b"\n") == 3  # header, exchange, seal: no newline leaks out of a string
    assert load_tape(tmp_path / "t.tape").exchanges == [exchange]
    assert orjson.loads(data.splitlines()[1])["request"]["body"] == {"text": text}


def test_streamed_chunks_keep_their_boundaries_and_arrival_offsets(tmp_path):
    chunks = [Chunk(at_us, f"data: {i}\n\n".encode()) for i, at_us in enumerate([0, 5, 5, 900])]
    response = Response(200, "OK", "HTTP/1.1", [], chunks=chunks, trailers=[("grpc-status", "0")])
    write_tape(tmp_path / "t.tape", [Exchange(0, 0, json_request(b"{}"), response)])
    loaded = load_tape(tmp_path / "t.tape").exchanges[0].response
    assert loaded.chunks == chunks
    assert loaded.trailers == [("grpc-status", "0")]
    assert loaded.streamed and loaded.content == b"".join(c.data for c in chunks)


def test_upstream_error_keeps_the_partial_chunks_that_arrived(tmp_path):
    cut = sample_exchanges()[2]
    write_tape(tmp_path / "t.tape", [cut])
    loaded = load_tape(tmp_path / "t.tape").exchanges[0]
    assert loaded.error == UpstreamError("reset", "connection reset by peer", 1)
    assert loaded.response.chunks == [Chunk(7, b"data: 1\n\n")]
    assert loaded.source == "injected"


def test_duplicate_headers_keep_their_order_and_case(tmp_path):
    headers = [("Set-Cookie", "a=1"), ("x-b", "2"), ("set-cookie", "b=2"), ("Set-Cookie", "a=1")]
    request = Request("GET", "https://h/", "HTTP/1.1", headers, b"")
    exchange = Exchange(0, 0, request, Response(200, "OK", "HTTP/1.1", headers[::-1], body=b""))
    write_tape(tmp_path / "t.tape", [exchange])
    loaded = load_tape(tmp_path / "t.tape").exchanges[0]
    assert loaded.request.headers == headers
    assert loaded.response.headers == headers[::-1]


def test_bodies_of_several_megabytes_round_trip_byte_exact(tmp_path):
    binary = os.urandom(4 * 1024 * 1024)
    text = ('{"delta":"\\u00e9 \\"quoted\\"\\n"}\n' * 100_000).encode()  # ~3 MB, escapes galore
    chunks = [Chunk(i, text[i : i + 65536]) for i in range(0, len(text), 65536)]
    exchanges = [
        Exchange(0, 0, json_request(binary), Response(200, "OK", "HTTP/1.1", [], body=text)),
        Exchange(1, 0, json_request(text), Response(200, "OK", "HTTP/1.1", [], chunks=chunks)),
    ]
    write_tape(tmp_path / "t.tape", exchanges)
    loaded = load_tape(tmp_path / "t.tape").exchanges
    assert loaded[0].request.body == binary
    assert loaded[0].response.body == text
    assert loaded[1].response.chunks == chunks
    assert loaded == exchanges


def test_every_line_is_one_json_object_ending_with_its_chain_hash(tmp_path):
    data = sample_tape(tmp_path / "t.tape")
    previous = GENESIS
    for line in data.splitlines():
        record = orjson.loads(line)
        assert list(record)[-1] == "hash"
        canonical, found = unframe(line)
        assert orjson.loads(canonical) == {k: v for k, v in record.items() if k != "hash"}
        previous = frame(canonical, previous)[1]
        assert found == previous.hex()
    assert [orjson.loads(line)["type"] for line in data.splitlines()] == [
        "header",
        *["exchange"] * 3,
        "end",
    ]


# -- 2. tampering ------------------------------------------------------------------------------


def hash_spans(data: bytes) -> set[int]:
    """Offsets of the hex digits of every hash the tape carries (line hashes, final_hash)."""
    spans: set[int] = set()
    for marker in (b'"hash":"', b'"final_hash":"'):
        start = data.find(marker)
        while start != -1:
            first = start + len(marker)
            spans.update(range(first, first + 64))
            start = data.find(marker, first)
    return spans


def replacements(data: bytes, offset: int, hashes: set[int]) -> dict[str, bytes]:
    """Ways to change the byte at `offset`, each giving a whole tampered tape."""
    byte = data[offset]
    if offset in hashes:
        other = HEX_DIGITS[(HEX_DIGITS.index(byte) + 1) % 16]
    elif chr(byte).isdigit():
        other = ord("0") + (byte - ord("0") + 1) % 10
    else:
        other = ord("x") if byte != ord("x") else ord("y")
    candidates = {
        "flip low bit": byte ^ 0x01,
        "flip high bit": byte ^ 0x80,
        "plausible other": other,
        "newline": ord("\n"),
        "space": ord(" "),
    }
    variants = {
        name: data[:offset] + bytes([new]) + data[offset + 1 :]
        for name, new in candidates.items()
        if new != byte
    }
    variants["delete"] = data[:offset] + data[offset + 1 :]
    variants["insert space"] = data[:offset] + b" " + data[offset:]
    return variants


def test_every_single_byte_change_is_detected(tmp_path, scratch):
    original = sample_tape(tmp_path / "t.tape")
    hashes = hash_spans(original)
    assert len(hashes) == 64 * 6  # five line hashes and the seal's final_hash
    missed, crashed, tried = [], [], 0
    for offset in range(len(original)):
        for name, tampered in replacements(original, offset, hashes).items():
            tried += 1
            try:
                verify_tape(scratch.holding(tampered))
            except TapeError:
                continue
            except Exception as exc:  # anything else is a crash, not a verdict
                crashed.append((offset, name, repr(exc)))
            else:
                missed.append((offset, name))
    assert tried > 5 * len(original)
    assert missed == [], f"tampering passed verify: {missed[:10]}"
    assert crashed == [], f"verify crashed instead of reporting: {crashed[:10]}"


def test_repair_never_seals_over_a_change_other_than_a_cut(tmp_path, scratch):
    original = sample_tape(tmp_path / "t.tape")
    hashes = hash_spans(original)
    target = scratch.path
    hidden = []
    for offset in range(len(original)):
        for name, tampered in replacements(original, offset, hashes).items():
            scratch.holding(tampered)
            try:
                verify_tape(target)
            except TruncatedTapeError:
                continue  # a last line without its newline looks exactly like a cut
            except TapeError:
                pass
            try:
                repair_tape(target)
            except TapeError:
                continue
            hidden.append((offset, name))
    assert hidden == [], f"repair sealed a tampered tape: {hidden[:10]}"


def test_only_a_missing_final_newline_reads_as_a_cut(tmp_path):
    original = sample_tape(tmp_path / "t.tape")
    target = tmp_path / "tampered.tape"
    with pytest.raises(TruncatedTapeError) as cut:
        verify_bytes(target, original[:-1])
    assert cut.value.intact_exchanges == 3
    repaired = repair_tape(target)
    assert repaired.exchanges == 3
    assert repaired.dropped_bytes == len(original) - line_ends(original)[-2] - 1


@pytest.mark.parametrize(
    ("index", "error", "line"),
    [
        (0, NotATapeError, 1),
        (1, BrokenChainError, 2),
        (2, BrokenChainError, 3),
        (3, BrokenChainError, 4),
        (4, TruncatedTapeError, 5),
    ],
    ids=["header", "exchange 1", "exchange 2", "exchange 3", "seal"],
)
def test_deleting_a_whole_line_is_detected(tmp_path, index, error, line):
    lines = sample_tape(tmp_path / "t.tape").splitlines(keepends=True)
    del lines[index]
    with pytest.raises(error) as found:
        verify_bytes(tmp_path / "t.tape", b"".join(lines))
    assert found.value.line == line


@pytest.mark.parametrize(("first", "second"), [(1, 2), (2, 3), (1, 3)])
def test_swapping_two_exchange_lines_is_detected(tmp_path, first, second):
    lines = sample_tape(tmp_path / "t.tape").splitlines(keepends=True)
    lines[first], lines[second] = lines[second], lines[first]
    with pytest.raises(BrokenChainError) as found:
        verify_bytes(tmp_path / "t.tape", b"".join(lines))
    assert found.value.line == first + 1


@pytest.mark.parametrize(
    ("index", "error"),
    [(0, BrokenChainError), (1, BrokenChainError), (3, BrokenChainError), (4, TapeFormatError)],
    ids=["header", "exchange 1", "exchange 3", "seal"],
)
def test_duplicating_a_line_is_detected(tmp_path, index, error):
    lines = sample_tape(tmp_path / "t.tape").splitlines(keepends=True)
    lines.insert(index + 1, lines[index])
    with pytest.raises(error) as found:
        verify_bytes(tmp_path / "t.tape", b"".join(lines))
    assert found.value.line == index + 2


def appended_after_seal(data: bytes) -> dict[str, bytes]:
    """Lines someone might add after the seal, including one that continues the chain."""
    seal_hash = bytes.fromhex(orjson.loads(data.splitlines()[-1])["hash"])
    parts, _ = frame(orjson.dumps(exchange_recs()[0] | {"seq": 9}), seal_hash)
    return {
        "chained exchange": b"".join(parts),
        "copy of the seal": data.splitlines(keepends=True)[-1],
        "empty line": b"\n",
        "partial line": b'{"type":"exch',
    }


@pytest.mark.parametrize(
    "extra", ["chained exchange", "copy of the seal", "empty line", "partial line"]
)
def test_a_line_after_the_seal_is_detected(tmp_path, extra):
    data = sample_tape(tmp_path / "t.tape")
    with pytest.raises(TapeFormatError, match="data after the end record") as found:
        verify_bytes(tmp_path / "t.tape", data + appended_after_seal(data)[extra])
    assert found.value.line == 6
    with pytest.raises(TapeFormatError):
        repair_tape(tmp_path / "t.tape")


# -- 3. truncation and repair -------------------------------------------------------------------


def expected_cut(ends: list[int], cut: int) -> tuple[int, int, int]:
    """(intact exchanges, intact bytes, line of the cut) for a tape cut after `cut` bytes."""
    whole = [end for end in ends if end <= cut]
    return max(len(whole) - 1, 0), whole[-1] if whole else 0, len(whole) + 1


def test_a_cut_at_every_offset_is_reported_as_truncation_with_the_intact_count(tmp_path, scratch):
    original = sample_tape(tmp_path / "t.tape")
    ends = line_ends(original)
    wrong = []
    for cut in range(len(original)):
        exchanges, intact_bytes, line = expected_cut(ends, cut)
        try:
            verify_tape(scratch.holding(original[:cut]))
        except TruncatedTapeError as exc:
            found = (exc.intact_exchanges, exc.intact_bytes, exc.line)
            if type(exc) is not TruncatedTapeError or found != (exchanges, intact_bytes, line):
                wrong.append((cut, found))
        except Exception as exc:
            wrong.append((cut, repr(exc)))
        else:
            wrong.append((cut, "verified ok"))
    assert wrong == [], f"cuts misreported: {wrong[:10]}"


def test_repair_of_a_cut_at_every_offset_keeps_exactly_the_intact_exchanges(tmp_path, scratch):
    original = sample_tape(tmp_path / "t.tape")
    exchanges = sample_exchanges()
    ends = line_ends(original)
    target = scratch.path
    for cut in range(ends[0], len(original)):
        kept, intact_bytes, _ = expected_cut(ends, cut)
        scratch.holding(original[:cut])
        repaired = repair_tape(target)
        assert (repaired.exchanges, repaired.dropped_bytes) == (kept, cut - intact_bytes), cut
        assert target.read_bytes()[:intact_bytes] == original[:intact_bytes], cut
        tape = load_tape(target)
        assert tape.exchanges == exchanges[:kept], cut
        assert tape.seal.exchanges == kept, cut
        assert tape.seal.recovered["dropped_bytes"] == cut - intact_bytes, cut
        assert isinstance(tape.seal.recovered["repaired"], str), cut
        assert repair_tape(target) is None, cut  # a repaired tape is sound


def test_repair_refuses_a_cut_inside_the_header(tmp_path, scratch):
    original = sample_tape(tmp_path / "t.tape")
    target = scratch.path
    for cut in range(line_ends(original)[0]):
        scratch.holding(original[:cut])
        with pytest.raises(TapeError, match="cannot repair"):
            repair_tape(target)
        assert target.read_bytes() == original[:cut], cut


def test_repair_leaves_a_sound_tape_untouched(tmp_path):
    original = sample_tape(tmp_path / "t.tape")
    assert repair_tape(tmp_path / "t.tape") is None
    assert tmp_path.joinpath("t.tape").read_bytes() == original


# -- 4. versions, other files, malformed lines ------------------------------------------------


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, 999, "1", None])
def test_a_correctly_chained_header_of_another_version_is_unknown_version(tmp_path, version):
    data = chained([header_rec(version=version), *exchange_recs(), seal(3)])
    with pytest.raises(UnknownVersionError) as found:
        verify_bytes(tmp_path / "t.tape", data)
    assert found.value.version == version
    assert found.value.line == 1
    assert f"reads version {FORMAT_VERSION}" in str(found.value)


@pytest.mark.parametrize(
    "content",
    [
        b'{"name": "wiretape", "version": 1}\n',
        b'{"type":"header","format":"har","version":1}\n',
        b"[1, 2, 3]\n",
        b"hello, this is a text file\nwith two lines\n",
        b"no newline at all",
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
        b"\n",
    ],
    ids=["json object", "other format", "json array", "text", "one line", "binary", "blank"],
)
def test_a_file_that_is_not_a_tape_is_reported_as_such(tmp_path, content):
    with pytest.raises(NotATapeError) as found:
        verify_bytes(tmp_path / "t.tape", content)
    assert found.value.line == 1
    assert "not a wiretape tape" in str(found.value)


def change(record: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `record` with the field at dotted `path` set (or removed, for `...`)."""
    record = orjson.loads(orjson.dumps(record))
    *parents, last = path.split(".")
    target = record
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return record


def malformed_tapes() -> dict[str, tuple[list[Any], int, str]]:
    """Correctly chained tapes with one bad record: (items, line at fault, message)."""
    head = header_rec()
    ex0, ex1, ex2 = exchange_recs()
    return {
        "not json": ([head, ex0, b'{"type":"exchange",seq:1}', ex2, seal(3)], 3, "not valid JSON"),
        "seq is a string": ([head, ex0, change(ex1, "seq", "1"), ex2, seal(3)], 3, "seq: expected"),
        "seq is a bool": ([head, ex0, change(ex1, "seq", True), ex2, seal(3)], 3, "seq: expected"),
        "seq is a float": ([head, change(ex0, "seq", 0.0), ex1, ex2, seal(3)], 2, "seq: expected"),
        "headers not pairs": (
            [head, ex0, change(ex1, "request.headers", [["a"]]), ex2, seal(3)],
            3,
            "request.headers: expected [name, value] string pairs",
        ),
        "body is a string": (
            [head, change(ex0, "request.body", "hi"), ex1, ex2, seal(3)],
            2,
            "request.body: expected an object",
        ),
        "body text and base64": (
            [head, change(ex0, "request.body", {"text": "", "base64": ""}), ex1, ex2, seal(3)],
            2,
            "request.body: expected exactly one",
        ),
        "bad base64": (
            [head, change(ex0, "request.body", {"base64": "!!!"}), ex1, ex2, seal(3)],
            2,
            "request.body.base64: not valid base64",
        ),
        "missing timings": ([head, ex0, change(ex1, "timings", ...), ex2, seal(3)], 3, "timings"),
        "missing method": (
            [head, change(ex0, "request.method", ...), ex1, ex2, seal(3)],
            2,
            "method",
        ),
        "response is a list": (
            [head, change(ex0, "response", []), ex1, ex2, seal(3)],
            2,
            "response",
        ),
        "body and chunks": (
            [head, ex0, change(ex1, "response.body", {"text": ""}), ex2, seal(3)],
            3,
            "exactly one of body and chunks",
        ),
        "chunk not an object": (
            [head, ex0, change(ex1, "response.chunks", ["x"]), ex2, seal(3)],
            3,
            "response.chunks[0]",
        ),
        "unknown source": ([head, ex0, ex1, change(ex2, "source", "x"), seal(3)], 4, "source"),
        "unknown error kind": (
            [head, ex0, ex1, change(ex2, "error.kind", "x"), seal(3)],
            4,
            "kind",
        ),
        "unknown record type": (
            [head, ex0, change(ex1, "type", "blob"), ex2, seal(3)],
            3,
            "unknown record type 'blob'",
        ),
        "no record type": ([head, ex0, change(ex1, "type", ...), ex2, seal(3)], 3, "record type"),
        "second header": ([head, ex0, head, ex2, seal(3)], 3, "a second header record"),
        "duplicate seq": (
            [head, ex0, ex1, change(ex2, "seq", 1), seal(3)],
            4,
            "sequence number 1 appears twice",
        ),
        "seal count too low": ([head, ex0, ex1, ex2, seal(2)], 5, "counts 2 exchanges"),
        "seal count too high": ([head, ex0, ex1, ex2, seal(4)], 5, "counts 4 exchanges"),
        "seal final_hash wrong": ([head, ex0, ex1, ex2, seal(3, "00" * 32)], 5, "final_hash"),
        "seal missing ended": ([head, ex0, ex1, ex2, change(seal(3), "ended", ...)], 5, "ended"),
        "no hash field": (
            [head, ex0, RawLine(orjson.dumps(ex1) + b"\n"), ex2, seal(3)],
            3,
            'does not end with a "hash" field',
        ),
        "header hash algorithm": (
            [header_rec(hash_algorithm="sha256"), ex0, seal(1)],
            1,
            "unknown hash algorithm",
        ),
        "header missing created": (
            [change(header_rec(), "created", ...), ex0, seal(1)],
            1,
            "created: missing",
        ),
        "header meta not object": ([header_rec(meta=[]), ex0, seal(1)], 1, "meta: expected"),
    }


@pytest.mark.parametrize("case", list(malformed_tapes()))
def test_a_malformed_but_chained_record_is_a_format_error_on_its_line(tmp_path, case):
    items, line, message = malformed_tapes()[case]
    with pytest.raises(TapeFormatError) as found:
        verify_bytes(tmp_path / "t.tape", chained(items))
    assert type(found.value) is TapeFormatError
    assert found.value.line == line
    assert message in found.value.detail
    assert str(tmp_path / "t.tape") in str(found.value)


def test_the_chained_helper_builds_tapes_that_verify(tmp_path):
    # Guards the malformed-line cases above: only the named change makes them fail.
    summary = verify_bytes(tmp_path / "t.tape", chained([header_rec(), *exchange_recs(), seal(3)]))
    assert summary.exchanges == 3


def test_non_ascii_base64_is_a_format_error_not_a_crash(tmp_path):
    head, ex0 = header_rec(), exchange_recs()[0]
    items = [head, change(ex0, "request.body", {"base64": "é"}), seal(1)]
    with pytest.raises(TapeFormatError, match="base64"):
        verify_bytes(tmp_path / "t.tape", chained(items))


@pytest.mark.parametrize(
    "bad",
    [
        Exchange(0, 0, json_request(b""), Response(200, "OK", "HTTP/1.1", [])),
        Exchange(0, 0, json_request(b""), None, source="replayed"),
        Exchange(0, 0, json_request(b""), None, UpstreamError("eof", "")),
    ],
    ids=["response without body or chunks", "unknown source", "unknown error kind"],
)
def test_the_writer_refuses_an_exchange_the_reader_would_reject(tmp_path, bad):
    with TapeWriter(tmp_path / "t.tape", redaction={}, fsync="never") as writer:
        writer.append(sample_exchanges()[1])
        with pytest.raises(ValueError):
            writer.append(bad)
    assert verify_tape(tmp_path / "t.tape").exchanges == 1


def test_the_writer_refuses_a_repeated_seq(tmp_path):
    with TapeWriter(tmp_path / "t.tape", redaction={}, fsync="never") as writer:
        writer.append(sample_exchanges()[0])
        with pytest.raises(ValueError):
            writer.append(sample_exchanges()[0])
    assert verify_tape(tmp_path / "t.tape").exchanges == 1


# -- 5. the writer ------------------------------------------------------------------------------


def test_the_writer_refuses_to_replace_an_existing_file(tmp_path):
    path = tmp_path / "t.tape"
    path.write_bytes(b"precious")
    with pytest.raises(TapeExistsError, match="already exists"):
        TapeWriter(path, redaction={})
    assert path.read_bytes() == b"precious"
    assert issubclass(TapeExistsError, FileExistsError)


def test_the_writer_replaces_an_existing_file_when_told_to(tmp_path):
    path = tmp_path / "t.tape"
    sample_tape(path)
    with TapeWriter(path, redaction={}, fsync="never", overwrite=True) as writer:
        writer.append(sample_exchanges()[0])
    assert verify_tape(path).exchanges == 1


def test_an_unknown_fsync_policy_is_refused_before_any_file_is_made(tmp_path):
    with pytest.raises(ValueError, match="fsync"):
        TapeWriter(tmp_path / "t.tape", redaction={}, fsync="sometimes")
    assert not tmp_path.joinpath("t.tape").exists()


@pytest.mark.parametrize("policy", FSYNC_POLICIES)
def test_every_fsync_policy_writes_a_tape_that_verifies(tmp_path, policy):
    writer = write_tape(tmp_path / "t.tape", sample_exchanges(), fsync=policy)
    assert writer.sealed and writer.exchanges == 3
    assert load_tape(tmp_path / "t.tape").exchanges == sample_exchanges()


def record_fsyncs(monkeypatch) -> list[int]:
    """Make os.fsync log the thread that calls it (and still sync)."""
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_fsync_never_does_not_sync(tmp_path, monkeypatch):
    calls = record_fsyncs(monkeypatch)
    write_tape(tmp_path / "t.tape", sample_exchanges(), fsync="never")
    assert calls == []


def test_fsync_always_syncs_each_append_before_returning(tmp_path, monkeypatch):
    calls = record_fsyncs(monkeypatch)
    with TapeWriter(tmp_path / "t.tape", redaction={}, fsync="always") as writer:
        for count, exchange in enumerate(sample_exchanges(), start=1):
            before = len(calls)
            writer.append(exchange)
            assert len(calls) > before, count
    assert set(calls) == {threading.get_ident()}


def test_fsync_batched_syncs_from_a_background_thread(tmp_path, monkeypatch):
    calls = record_fsyncs(monkeypatch)
    with TapeWriter(tmp_path / "t.tape", redaction={}, fsync="batched") as writer:
        calls.clear()
        for exchange in sample_exchanges():
            writer.append(exchange)
        assert threading.get_ident() not in calls  # appends never wait for the disk
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls and threading.get_ident() not in calls


def test_the_batched_sync_thread_stops_on_close(tmp_path):
    before = set(threading.enumerate())
    writer = TapeWriter(tmp_path / "t.tape", redaction={}, fsync="batched")
    started = set(threading.enumerate()) - before
    assert len(started) == 1 and all(t.is_alive() for t in started)
    writer.append(sample_exchanges()[0])
    time.sleep(0.05)  # let the thread reach its interval wait
    writer.close()
    assert not any(t.is_alive() for t in started)
    assert set(threading.enumerate()) - before == set()


def test_appending_after_close_raises_and_leaves_the_tape_alone(tmp_path):
    writer = write_tape(tmp_path / "t.tape", sample_exchanges())
    sealed = tmp_path.joinpath("t.tape").read_bytes()
    with pytest.raises(ValueError, match="sealed"):
        writer.append(sample_exchanges()[0])
    writer.close()  # a second close is harmless
    assert tmp_path.joinpath("t.tape").read_bytes() == sealed


def test_a_tape_still_being_written_reads_as_truncated_with_its_count(tmp_path):
    writer = TapeWriter(tmp_path / "t.tape", redaction={}, fsync="never")
    try:
        for exchange in sample_exchanges()[:2]:
            writer.append(exchange)
        with pytest.raises(TruncatedTapeError) as cut:
            verify_tape(tmp_path / "t.tape")
        assert (cut.value.intact_exchanges, cut.value.line) == (2, 4)
    finally:
        writer.close()
    assert verify_tape(tmp_path / "t.tape").exchanges == 2


def test_a_failed_write_does_not_break_the_chain_of_later_records(tmp_path, monkeypatch):
    path = tmp_path / "t.tape"
    first, second, third = sample_exchanges()
    writer = TapeWriter(path, redaction={}, fsync="never")
    writer.append(first)
    real_write_all = tape_writer._write_all

    def disk_full_once(fd: int, parts: list) -> None:
        monkeypatch.setattr(tape_writer, "_write_all", real_write_all)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tape_writer, "_write_all", disk_full_once)
    with pytest.raises(OSError):
        writer.append(second)
    try:  # refusing to go on after a failed write is as good as going on correctly
        writer.append(third)
        writer.close()
    except (OSError, ValueError):
        pass
    try:
        verify_tape(path)
    except TruncatedTapeError:
        repair_tape(path)
    assert [e.seq for e in load_tape(path).exchanges] in ([0], [0, 2])


CRASHING_RECORDER = textwrap.dedent(
    """
    import os, sys
    from wiretape.tapes import Exchange, Request, Response, TapeWriter

    path, policy, count, partial = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    writer = TapeWriter(path, redaction={}, fsync=policy)
    for seq in range(count):
        request = Request("GET", f"https://h/{seq}", "HTTP/1.1", [], b"")
        writer.append(Exchange(seq, seq, request, Response(200, "OK", "HTTP/1.1", [], b"ok")))
    os.write(writer._fd, partial.encode())  # half a record, as a crash mid-write leaves it
    os._exit(0)
    """
)


@pytest.mark.parametrize("policy", FSYNC_POLICIES)
@pytest.mark.parametrize("partial", ["", '{"type":"exchange","seq":5,"off'])
def test_a_recorder_killed_mid_tape_leaves_a_repairable_cut(tmp_path, policy, partial):
    path = tmp_path / "t.tape"
    args = [str(path), policy, "5", partial]
    subprocess.run([sys.executable, "-c", CRASHING_RECORDER, *args], check=True, timeout=60)
    with pytest.raises(TruncatedTapeError) as cut:
        verify_tape(path)
    assert (cut.value.intact_exchanges, cut.value.line) == (5, 7)
    repaired = repair_tape(path)
    assert (repaired.exchanges, repaired.dropped_bytes) == (5, len(partial))
    tape = load_tape(path)
    assert [e.request.url for e in tape.exchanges] == [f"https://h/{i}" for i in range(5)]
    assert tape.seal.recovered["dropped_bytes"] == len(partial)
