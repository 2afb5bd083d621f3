"""Verify a tape end to end, and repair one that a crash cut short."""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson

from .chain import frame
from .errors import TapeError, TruncatedTapeError
from .model import Header, Seal, seal_record
from .reader import TapeReader
from .writer import _write_all, utc_now


@dataclass(slots=True)
class TapeSummary:
    path: str
    header: Header
    exchanges: int
    seal: Seal


def verify_tape(path: str | os.PathLike[str]) -> TapeSummary:
    """Check every record of a tape, streaming; raises `TapeError` on the first problem."""
    with TapeReader(path) as reader:
        for _ in reader:
            pass
        assert reader.seal is not None
        return TapeSummary(reader.path, reader.header, reader.exchanges_read, reader.seal)


@dataclass(slots=True)
class Repair:
    path: str
    exchanges: int
    dropped_bytes: int


def repair_tape(path: str | os.PathLike[str]) -> Repair | None:
    """Seal a crash-cut tape after its intact prefix. None when the tape was already sound.

    Only truncation is repaired: a crash can leave a partial last line, but never a broken
    chain or a bad record in the middle, and sealing those would hide an edit.
    """
    try:
        verify_tape(path)
        return None
    except TruncatedTapeError as cut:
        if cut.intact_bytes == 0:
            raise TapeError(cut.path, 1, "cannot repair: not even the header is intact") from None
        return _seal_prefix(cut)


def _seal_prefix(cut: TruncatedTapeError) -> Repair:
    dropped = os.path.getsize(cut.path) - cut.intact_bytes
    now = utc_now()
    seal = Seal(
        cut.intact_exchanges,
        cut.chain_head.hex(),
        now,
        {"repaired": now, "dropped_bytes": dropped},
    )
    parts, _ = frame(orjson.dumps(seal_record(seal)), cut.chain_head)
    fd = os.open(cut.path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, cut.intact_bytes)
        os.lseek(fd, cut.intact_bytes, os.SEEK_SET)
        _write_all(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)
    return Repair(cut.path, cut.intact_exchanges, dropped)
