"""Name an upstream failure by the tape's error kinds, from the text a proxy or client gives."""

from __future__ import annotations


def classify_error(message: str) -> str:
    """Map mitmproxy's error text to the tape's error kinds."""
    text = message.lower()
    for kind, needles in _ERROR_NEEDLES:
        if any(needle in text for needle in needles):
            return kind
    return "other"


_ERROR_NEEDLES = (
    ("aborted", ("client disconnected", "client closed")),
    (
        "dns",
        ("name or service not known", "nodename nor servname", "getaddrinfo", "name resolution"),
    ),
    ("refused", ("connection refused", "connect call failed", "errno 111")),
    ("tls", ("tls", "ssl", "certificate")),
    ("timeout", ("timed out", "timeout")),
    ("reset", ("reset", "peer closed", "server disconnected", "connection closed", "broken pipe")),
    ("protocol", ("protocol error", "invalid", "malformed")),
)
