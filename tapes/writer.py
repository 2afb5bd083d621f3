"""Append exchanges to a new tape: whole records, flushed, chained and sealed.

Each record goes to the file in one `writev` on an `O_APPEND` descriptor, so a crash leaves
whole records followed by at most one partial line, which readers report as truncation. The
fsync policy bounds what a power loss can take: `always` syncs every record, `batched` syncs
from a background thread at most `BATCH_INTERVAL` seconds after a write, `never` leaves it to
the operating system. `append` does no waiting beyond its own write (except under `always`),
so the proxy's event loop can call it directly.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

from ._version import VERSION
from .chain import GENESIS, frame
from .errors import TapeExistsError
from .model import (
    Exchange,
    Header,
    Seal,
    check_exchange,
    exchange_record,
    header_record,
    seal_record,
)

FsyncPolicy = Literal["always", "batched", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "batched", "never")
BATCH_INTERVAL = 0.5


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TapeWriter:
    """Writes one tape. Use as a context manager, or call `close()` to seal it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        redaction: dict[str, Any],
        meta: dict[str, Any] | None = None,
        fsync: FsyncPolicy = "batched",
        overwrite: bool = False,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}")
        self.path = Path(path)
        self.fsync = fsync
        self.exchanges = 0
        self.sealed = False
        self.failed: OSError | None = None
        self._previous = GENESIS
        self._seqs: set[int] = set()
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._closing = threading.Event()
        self._syncer: threading.Thread | None = None
        self._started = time.monotonic()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        flags |= os.O_TRUNC if overwrite else os.O_EXCL
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except FileExistsError:
            raise TapeExistsError(
                f"{self.path}: a tape already exists there (use --overwrite to replace it)"
            ) from None
        self.header = Header(
            created=utc_now(), wiretape=VERSION, redaction=redaction, meta=meta or {}
        )
        self._write(header_record(self.header))
        if fsync != "never":
            os.fsync(self._fd)
            _fsync_directory(self.path)
        if fsync == "batched":
            self._syncer = threading.Thread(target=self._sync_batches, daemon=True)
            self._syncer.start()

    def offset_us(self) -> int:
        """Microseconds since the tape was created: the clock for `Exchange.offset_us`."""
        return int((time.monotonic() - self._started) * 1_000_000)

    def append(self, exchange: Exchange) -> None:
        """Write one exchange. Raises ValueError for an exchange the format cannot hold
        (checked before writing: a bad record would end the tape's valid prefix)."""
        with self._lock:
            if self.sealed:
                raise ValueError(f"{self.path}: the tape is sealed")
            check_exchange(exchange)
            if exchange.seq in self._seqs:
                raise ValueError(f"sequence number {exchange.seq} is already on the tape")
            self._write(exchange_record(exchange))
            self._seqs.add(exchange.seq)
            self.exchanges += 1

    def close(self, recovered: dict[str, Any] | None = None) -> None:
        """Seal the tape with its end record and release the file. Safe to call twice."""
        with self._lock:
            if self.sealed:
                return
            self.sealed = True
        try:
            # After a failed write the tape ends in a partial line: leave it unsealed, for
            # `verify --repair`, rather than seal over the gap.
            if self.failed is None:
                seal = Seal(self.exchanges, self._previous.hex(), utc_now(), recovered)
                self._write(seal_record(seal))
        finally:
            self._closing.set()
            self._dirty.set()  # wake the syncer so it sees _closing
            if self._syncer is not None:
                self._syncer.join()
            try:
                if self.fsync != "never":
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)

    def __enter__(self) -> TapeWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, record: dict[str, Any]) -> None:
        if self.failed is not None:
            raise OSError(f"{self.path}: an earlier write failed ({self.failed})")
        parts, digest = frame(orjson.dumps(record), self._previous)
        try:
            _write_all(self._fd, parts)
        except OSError as exc:
            # Whatever part of the line reached the file is a partial last line: the tape
            # stays a valid, repairable prefix as long as nothing is appended after it.
            self.failed = exc
            raise
        self._previous = digest
        if self.fsync == "always":
            os.fsync(self._fd)
        elif not self._dirty.is_set():  # is_set() takes no lock; set() does
            self._dirty.set()

    def _sync_batches(self) -> None:
        while not self._closing.is_set():
            self._dirty.wait()
            self._dirty.clear()
            try:
                os.fsync(self._fd)
            except OSError:
                return  # closed under us; close() syncs for itself
            self._closing.wait(BATCH_INTERVAL)


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    views = [memoryview(part) for part in parts]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _fsync_directory(path: Path) -> None:
    fd = os.open(path.parent or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
