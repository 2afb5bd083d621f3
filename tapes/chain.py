"""The hash chain: how a record's canonical bytes become its line, and how a line is checked.

A line is the record's canonical bytes (a compact JSON object) with `,"hash":"<64 hex>"` put
before its closing brace, then a newline. The hash is BLAKE3 over the previous record's raw
32-byte digest followed by the canonical bytes; the header chains from 32 zero bytes.
"""

from __future__ import annotations

import re

from blake3 import blake3

GENESIS = bytes(32)
HASH_HEX_LEN = 64
_HASH_OPEN = b',"hash":"'
# ,"hash":" + 64 hex digits + "}
SUFFIX_LEN = len(_HASH_OPEN) + HASH_HEX_LEN + 2
_SUFFIX = re.compile(rb',"hash":"([0-9a-f]{64})"\}\Z')


def chain_digest(previous: bytes, canonical: bytes) -> bytes:
    hasher = blake3(previous)
    hasher.update(canonical)
    return hasher.digest()


def frame(canonical: bytes, previous: bytes) -> tuple[list[bytes | memoryview], bytes]:
    """The parts of the line for `canonical` (to write in order) and the record's digest."""
    digest = chain_digest(previous, canonical)
    # A memoryview keeps a large body from being copied just to drop its closing brace.
    parts = [memoryview(canonical)[:-1], _HASH_OPEN + digest.hex().encode("ascii") + b'"}\n']
    return parts, digest


def unframe(line: bytes) -> tuple[bytes, str] | None:
    """Split a line (without its newline) into canonical bytes and the hex hash it carries.

    Returns None when the line does not end in a well-formed hash field.
    """
    match = _SUFFIX.search(line, len(line) - SUFFIX_LEN)
    if match is None:
        return None
    return line[:-SUFFIX_LEN] + b"}", match.group(1).decode("ascii")
