"""wiretape: record and replay the HTTP traffic of AI agents.

The names below are the library API; everything else may change. Importing this package
stays cheap: the proxy machinery (mitmproxy) loads only when `RecordingProxy` is used.

    from wiretape import Replayer, ReplayServer, Redactor, load_or_create_key
"""

from importlib import import_module
from typing import Any

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

# Imported on first use: name -> module.
_LAZY = {
    "RecordingProxy": ".recording",
    "RecordingConfig": ".recording",
    "Replayer": ".replay",
    "DivergenceReport": ".replay",
    "ReplayServer": ".replay_server",
    "MatchRules": ".matching",
    "Redactor": ".redact",
    "load_or_create_key": ".redact",
    "FakeUpstream": ".fake_upstream",
}

__all__ = [
    "DivergenceReport",
    "Exchange",
    "FakeUpstream",
    "MatchRules",
    "RecordingConfig",
    "RecordingProxy",
    "Redactor",
    "ReplayServer",
    "Replayer",
    "Tape",
    "TapeError",
    "TapeReader",
    "TapeWriter",
    "__version__",
    "load_or_create_key",
    "load_tape",
    "verify_tape",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wiretape' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
