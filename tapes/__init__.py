"""The tape format: records, the hash chain, the writer, the reader, verify and repair.

This package is the ground floor of wiretape: it needs only blake3 and orjson, so anyone can
read and verify a tape without the proxy. The format is specified in FORMAT.md beside it.
"""

from ._version import VERSION
from .errors import (
    BrokenChainError,
    NotATapeError,
    TapeError,
    TapeExistsError,
    TapeFormatError,
    TruncatedTapeError,
    UnknownVersionError,
)
from .model import (
    FORMAT_VERSION,
    Chunk,
    Exchange,
    Header,
    Request,
    Response,
    Seal,
    Timings,
    UpstreamError,
)
from .reader import Tape, TapeReader, exchange_at, load_tape
from .verify import Repair, TapeSummary, repair_tape, verify_tape
from .writer import FSYNC_POLICIES, FsyncPolicy, TapeWriter

__all__ = [
    "FORMAT_VERSION",
    "FSYNC_POLICIES",
    "VERSION",
    "BrokenChainError",
    "Chunk",
    "Exchange",
    "FsyncPolicy",
    "Header",
    "NotATapeError",
    "Repair",
    "Request",
    "Response",
    "Seal",
    "Tape",
    "TapeError",
    "TapeExistsError",
    "TapeFormatError",
    "TapeReader",
    "TapeSummary",
    "TapeWriter",
    "Timings",
    "TruncatedTapeError",
    "UnknownVersionError",
    "UpstreamError",
    "exchange_at",
    "load_tape",
    "repair_tape",
    "verify_tape",
]
