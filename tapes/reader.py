"""Read a tape front to back, checking every record: the one reader that everything uses.

The reader streams: it holds one line at a time, so verifying a tape of any size takes
constant memory. It raises the first problem it meets as a `TapeError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from .chain import GENESIS, link_digest, split_hash
from .errors import (
    BrokenChainError,
    NotATapeError,
    TapeFormatError,
    TruncatedTapeError,
    UnknownVersionError,
)
from .model import (
    FORMAT_NAME,
    FORMAT_VERSION,
    HASH_ALGORITHM,
    Exchange,
    Header,
    RecordError,
    Seal,
    exchange_from_record,
    header_from_record,
    seal_from_record,
)

# What every header line starts with: tells a cut header from some other file.
_HEADER_PREFIX = b'{"type":"header","format":"' + FORMAT_NAME.encode() + b'"'


class TapeReader:
    """Opens a tape, checks its header, then yields its exchanges in file order.

    After iteration ends without an error, `seal` holds the end record. `chain_head` and
    `intact_bytes` describe the valid prefix read so far, which is what repair keeps;
    `last_span` is the (offset, length) of the record just read, for `exchange_at`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.seal: Seal | None = None
        self.exchanges_read = 0
        self.intact_bytes = 0
        self.chain_head = GENESIS
        self.last_span = (0, 0)
        self._line = 0
        self._file: BinaryIO = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        try:
            self.header = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> TapeReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[Exchange]:
        seqs: set[int] = set()
        for raw in self._file:
            self._line += 1
            if self.seal is not None:
                raise self._format_error("data after the end record")
            record, digest = self._check(raw)
            kind = record.get("type")
            if kind == "exchange":
                exchange = self._decode(exchange_from_record, record)
                if exchange.seq in seqs:
                    raise self._format_error(f"sequence number {exchange.seq} appears twice")
                seqs.add(exchange.seq)
                self._advance(raw, digest)
                self.exchanges_read += 1
                yield exchange
            elif kind == "end":
                self.seal = self._decode(seal_from_record, record)
                self._check_seal(self.seal)
                self._advance(raw, digest)
            elif kind == "header":
                raise self._format_error("a second header record")
            else:
                raise self._format_error(f"unknown record type {kind!r}")
        if self.seal is None:
            raise self._truncated(self._line + 1)

    # -- one line -------------------------------------------------------------------------

    def _read_header(self) -> Header:
        raw = self._file.readline()
        self._line = 1
        if not raw.endswith(b"\n"):
            if _HEADER_PREFIX.startswith(raw[: len(_HEADER_PREFIX)]):
                raise TruncatedTapeError(self.path, 1, 0, 0)
            raise NotATapeError(self.path, 1, "not a wiretape tape (no header record)")
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record = None
        if not (
            isinstance(record, dict)
            and record.get("type") == "header"
            and record.get("format") == FORMAT_NAME
        ):
            raise NotATapeError(self.path, 1, "not a wiretape tape (no header record)")
        if record.get("version") != FORMAT_VERSION:
            raise UnknownVersionError(self.path, record.get("version"), FORMAT_VERSION)
        checked, digest = self._check(raw)
        header = self._decode(header_from_record, checked)
        if header.hash_algorithm != HASH_ALGORITHM:
            raise self._format_error(f"unknown hash algorithm {header.hash_algorithm!r}")
        self._advance(raw, digest)
        return header

    def _check(self, raw: bytes) -> tuple[dict[str, Any], bytes]:
        """Check a line's framing and chain link; return its record and digest."""
        if not raw.endswith(b"\n"):
            raise self._truncated(self._line)
        framed = split_hash(raw[:-1])
        if framed is None:
            raise self._format_error('the line does not end with a "hash" field')
        before_hash, found = framed
        digest = link_digest(self.chain_head, before_hash)
        if digest != bytes.fromhex(found):
            raise BrokenChainError(self.path, self._line, digest.hex(), found)
        try:
            # The whole line parses as the record plus its "hash", which decoders ignore.
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise self._format_error(f"not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise self._format_error("the record is not a JSON object")
        return record, digest

    def _advance(self, raw: bytes, digest: bytes) -> None:
        self.chain_head = digest
        self.last_span = (self.intact_bytes, len(raw))
        self.intact_bytes += len(raw)

    def _decode(self, decoder, record: dict[str, Any]):
        try:
            return decoder(record)
        except RecordError as exc:
            raise self._format_error(str(exc)) from None

    def _check_seal(self, seal: Seal) -> None:
        if seal.exchanges != self.exchanges_read:
            raise self._format_error(
                f"the end record counts {seal.exchanges} exchanges, the tape holds "
                f"{self.exchanges_read}"
            )
        if seal.final_hash != self.chain_head.hex():
            raise self._format_error("the end record's final_hash is not the last record's hash")

    def _truncated(self, line: int) -> TruncatedTapeError:
        return TruncatedTapeError(
            self.path, line, self.exchanges_read, self.intact_bytes, self.chain_head
        )

    def _format_error(self, detail: str) -> TapeFormatError:
        return TapeFormatError(self.path, self._line, detail)


def exchange_at(data: bytes | memoryview, span: tuple[int, int]) -> Exchange:
    """Decode the exchange record at `span` of an already verified tape's bytes.

    Replay keeps only offsets in memory and decodes an exchange when it is served.
    """
    offset, length = span
    return exchange_from_record(orjson.loads(data[offset : offset + length]))


@dataclass(slots=True)
class Tape:
    """A whole tape in memory, checked."""

    path: str
    header: Header
    exchanges: list[Exchange]
    seal: Seal


def load_tape(path: str | os.PathLike[str]) -> Tape:
    """Read and check a whole tape; raises `TapeError` on the first problem."""
    with TapeReader(path) as reader:
        exchanges = list(reader)
        assert reader.seal is not None
        return Tape(reader.path, reader.header, exchanges, reader.seal)
