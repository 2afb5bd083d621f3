"""wiretape: record and replay the HTTP traffic of AI agents.

Importing this package stays cheap: the proxy machinery (mitmproxy) loads only when a
recorder starts.
"""

from .tapes import VERSION as __version__
from .tapes import (
    Exchange,
    Tape,
    TapeError,
    TapeReader,
    TapeWriter,
    load_tape,
    verify_tape,
)

__all__ = [
    "Exchange",
    "Tape",
    "TapeError",
    "TapeReader",
    "TapeWriter",
    "__version__",
    "load_tape",
    "verify_tape",
]
