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
_HEX = re.compile(rb"[0-9a-f]{64}")


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
    """Split a line (without its newline) into its canonical bytes and the hex hash it carries.

    Returns None when the line does not end in a well-formed hash field.
    """
    split = split_hash(line)
    return None if split is None else (bytes(split[0]) + b"}", split[1])


def split_hash(line: bytes) -> tuple[memoryview, str] | None:
    """Like `unframe`, without copying: the bytes before the hash field (the canonical bytes
    less their closing brace) and the hex hash. For `link_digest`."""
    if len(line) <= SUFFIX_LEN or not line.endswith(b'"}'):
        return None
    if line[-SUFFIX_LEN : -SUFFIX_LEN + len(_HASH_OPEN)] != _HASH_OPEN:
        return None
    found = line[-HASH_HEX_LEN - 2 : -2]
    if _HEX.fullmatch(found) is None:
        return None
    return memoryview(line)[:-SUFFIX_LEN], found.decode("ascii")


def link_digest(previous: bytes, unframed: memoryview) -> bytes:
    """The chain hash of a record from what `split_hash` returned: its bytes, then the brace."""
    hasher = blake3(previous)
    hasher.update(unframed)
    hasher.update(b"}")
    return hasher.digest()
