"""Remove secrets from requests and responses before anything is hashed or written to a tape.

Three kinds of rule, all listed in `Redactor.policy()` and so in every tape header:

- by header name (`SECRET_HEADERS`): the value is a credential whatever it looks like;
- by query parameter name (`SECRET_QUERY_PARAMS`): likewise, in URLs;
- by shape (`SHAPES`, plus the user's `--redact` patterns): anywhere in bodies, URLs and other
  header values.

A secret becomes `[REDACTED:<kind>:<tag>]`, where the tag is a keyed BLAKE3 hash of the secret:
the same secret always gets the same placeholder under one key, two secrets get two, and nobody
without the key can test a guess against a tape. Placeholders are opaque to every rule, so
redacting twice changes nothing, and they hold no `"` or `\\`, so JSON stays JSON.

Bodies are matched as bytes, as they are: nothing inside a gzip or br body is seen, so a
compressed body must be decoded first (`decode_body`).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import secrets
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from blake3 import blake3

from .tapes import Chunk, Exchange, Request, Response

__all__ = [
    "KEY_FILE",
    "PLACEHOLDER",
    "SECRET_HEADERS",
    "SECRET_QUERY_PARAMS",
    "SHAPES",
    "Finding",
    "Redactor",
    "SecretShape",
    "UndecodableBody",
    "decode_body",
    "load_or_create_key",
    "scan_for_secrets",
]

KEY_FILE = "redaction.key"
KEY_SIZE = 32
TAG_BYTES = 6  # 12 hex digits: collisions between the secrets of one tape are not a concern
POLICY_VERSION = 1

# A header whose value is a credential whatever it looks like. Lower case.
SECRET_HEADERS: tuple[str, ...] = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
    "set-cookie",
    "x-amz-security-token",
    "ocp-apim-subscription-key",
)

# A query parameter whose value is a credential whatever it looks like. Lower case.
SECRET_QUERY_PARAMS: tuple[str, ...] = (
    "key",
    "api_key",
    "apikey",
    "access_token",
    "refresh_token",
    "token",
    "client_secret",
    "sig",
    "signature",
    "password",
    "x-amz-signature",
    "x-amz-security-token",
    "x-goog-signature",
)

# Kinds of placeholder that come from a name rather than a shape.
HEADER_KIND = "secret-header"
COOKIE_KIND = "cookie"
PARAM_KIND = "secret-param"
CUSTOM_KIND = "custom"

PLACEHOLDER = re.compile(rb"\[REDACTED:[a-z0-9-]+:[0-9a-f]{%d}\]" % (2 * TAG_BYTES))
_PLACEHOLDER_OPEN = b"[REDACTED:"


# -- what a secret looks like ---------------------------------------------------------------


def _token_start(prefix: bytes) -> bytes:
    """`prefix` (a fixed-width regex) where it begins a token of its own.

    Not glued to a letter, digit, `_` or `-` before it (that is what keeps "risk-free" and
    "task-list" from looking like `sk-` keys), unless that letter ends an escape that stands
    for a separator: JSON's `\\n`, `\\t`, `\\u0020` or a URL's `%20`. A key at the start of a
    line inside a JSON string follows `\\n`. The checks sit after the literal so that the
    pattern starts with it: the regex engine then skips straight to where the literal is.
    """
    return (
        prefix + rb"(?:(?<![A-Za-z0-9_-]" + prefix + rb")"
        rb"|(?<=\\[nrtbf]" + prefix + rb")"
        rb"|(?<=\\u[0-9A-Fa-f]{4}" + prefix + rb")"
        rb"|(?<=%[0-9A-Fa-f]{2}" + prefix + rb"))"
    )


@dataclass(frozen=True, slots=True)
class SecretShape:
    """One form of a kind of secret, recognisable by its shape.

    `lead` is context that introduces the secret and is kept (`Bearer `,
    `aws_secret_access_key=`); `secret` is what gets replaced. Neither may use capturing
    groups. Each form is searched on its own and must start with a literal: a form whose
    literal is absent costs one substring search, and a literal prefix is what makes the
    regex search fast. A lead written in lower case with `any_case` set matches in any
    case: it is searched in a lower-cased copy, which is quicker than a pass per spelling and
    much quicker than `(?i)`. Every secret must be a run of at least `MIN_RUN` bytes of
    `RUN_BYTES`: the fast path relies on it.
    """

    name: str
    secret: bytes
    lead: bytes = b""
    any_case: bool = False


_AWS_SEPARATOR = rb"""[\s"'`\\:=>]{1,8}"""

# In priority order: where two forms find overlapping secrets, the first to start names them,
# and at one start the first in this table ("Bearer sk-..." is an openai-key).
SHAPES: tuple[SecretShape, ...] = (
    SecretShape("anthropic-key", _token_start(rb"sk-ant-") + rb"[A-Za-z0-9_-]{32,}"),
    # Real keys are random base62: one without a capital or a digit is about 1 in 10^18, a
    # kebab-case identifier after "sk-" (sk-learn-compatible-...) nearly always is.
    SecretShape(
        "openai-key", _token_start(rb"sk-") + rb"(?=[A-Za-z0-9_-]*[A-Z0-9])[A-Za-z0-9_-]{32,}"
    ),
    SecretShape("aws-access-key-id", _token_start(rb"AKIA") + rb"[A-Z0-9]{16}(?![A-Za-z0-9])"),
    SecretShape("aws-access-key-id", _token_start(rb"ASIA") + rb"[A-Z0-9]{16}(?![A-Za-z0-9])"),
    # aws_secret_access_key, AWS_SECRET_ACCESS_KEY, SecretAccessKey, secret-access-key ...
    SecretShape(
        "aws-secret-key",
        lead=rb"secret[_-]?access[_-]?key" + _AWS_SEPARATOR,
        secret=rb"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
        any_case=True,
    ),
    SecretShape(
        "aws-session-token",
        lead=rb"session[_-]?token" + _AWS_SEPARATOR,
        secret=rb"[A-Za-z0-9/+=]{100,}",
        any_case=True,
    ),
    SecretShape("github-token", _token_start(rb"gh[pousr]_") + rb"[A-Za-z0-9]{36,}"),
    SecretShape("github-token", _token_start(rb"github_pat_") + rb"[A-Za-z0-9_]{50,}"),
    SecretShape("google-api-key", _token_start(rb"AIza") + rb"[A-Za-z0-9_-]{35,}"),
    # Slack tokens carry numeric team and user ids.
    SecretShape(
        "slack-token", _token_start(rb"xox[abposr]-") + rb"(?=[A-Za-z0-9-]*[0-9])[A-Za-z0-9-]{20,}"
    ),
    SecretShape("slack-token", _token_start(rb"xapp-") + rb"[0-9]-[A-Za-z0-9-]{20,}"),
    SecretShape(
        "slack-webhook",
        lead=rb"hooks\.slack\.com/(?:services|workflows|triggers)/",
        secret=rb"[A-Za-z0-9_/-]{16,}",
    ),
    SecretShape(
        "jwt",
        _token_start(rb"eyJ") + rb"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
    ),
    # "Bearer responsibilities" is prose; a token has a capital or a digit somewhere.
    SecretShape(
        "bearer-token",
        lead=rb"bearer[ \t]{1,8}",
        secret=rb"(?=[A-Za-z0-9._~+/=-]*[A-Z0-9])[A-Za-z0-9._~+/=-]{16,}",
        any_case=True,
    ),
)

# The fast path: every shape's secret is a run of at least MIN_RUN of these bytes, so bytes
# without such a run hold no shaped secret. `bytes.translate` and a substring search check
# that at C speed, about ten times faster than the passes of the forms over the same bytes.
RUN_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.~+/="
MIN_RUN = 16
_RUN_MASK = bytes(0x61 if byte in RUN_BYTES else 0x20 for byte in range(256))
_RUN_NEEDLE = b"a" * MIN_RUN


@dataclass(frozen=True, slots=True)
class _Form:
    rank: int  # its place in SHAPES: the earlier, the stronger its claim to a name
    name: str
    literal: bytes  # every match starts with it (in the lower-cased copy when `then` is set)
    search: re.Pattern[bytes]  # group 1 is the secret; or the lead alone when `then` is set
    then: re.Pattern[bytes] | None  # the secret, matched in the original bytes after the lead


def _form(rank: int, shape: SecretShape) -> _Form:
    match = _LITERAL_START.match(shape.lead or shape.secret)
    literal = match.group() if match else b""
    if not literal:
        raise ValueError(f"shape {shape.name}: its pattern must start with a literal")
    if shape.any_case:
        search, then = re.compile(shape.lead), re.compile(shape.secret)
        return _Form(rank, shape.name, literal, search, then)
    search = re.compile(shape.lead + b"(" + shape.secret + b")")
    return _Form(rank, shape.name, literal, search, None)


# Leading plain characters of a pattern, short of one a quantifier may make optional.
_LITERAL_START = re.compile(rb"[A-Za-z0-9_-]*?(?=[A-Za-z0-9_-]?[?*{]|[^A-Za-z0-9_-]|\Z)")
_FORMS = tuple(_form(rank, shape) for rank, shape in enumerate(SHAPES))
_BARE_FORMS = tuple(form for form in _FORMS if not SHAPES[form.rank].lead)

# What a report may show of a secret: the fixed prefix its format announces, nothing random.
_PUBLIC_PREFIX = re.compile(
    rb"sk-(?:ant-(?:api|admin|oat)?|proj-|svcacct-|admin-)?|AKIA|ASIA|AIza|gh[pousr]_"
    rb"|github_pat_|xox[abposr]-|xapp-|eyJ"
)


@dataclass(frozen=True, slots=True)
class Finding:
    """Something that still looks secret: what, where, and a preview that does not reveal it."""

    kind: str
    offset: int
    length: int
    preview: str


# -- the redactor ---------------------------------------------------------------------------


class Redactor:
    """Replaces secrets with keyed placeholders. Pure and thread-safe once built."""

    def __init__(self, key: bytes, extra_patterns: Sequence[str] = ()) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_SIZE:
            raise ValueError(f"the redaction key must be {KEY_SIZE} bytes")
        self._key = key
        self._extra = _pattern_list(extra_patterns)
        self._matcher = _matcher(self._extra)
        # Header values and URLs repeat from one request to the next (hosts, paths, content
        # types, user agents): remembering recent answers spares the passes over them.
        self._header_value = lru_cache(maxsize=4096)(self._redact_header_value)
        self._url = lru_cache(maxsize=1024)(self._redact_url)

    def policy(self) -> dict[str, Any]:
        """What this redactor removes, as recorded in a tape's header."""
        return {
            "version": POLICY_VERSION,
            "placeholder": "[REDACTED:<kind>:<tag>]",
            "tag": f"blake3 keyed hash of the secret, first {TAG_BYTES} bytes, hex",
            # Replay needs the recording's key for placeholders in requests to match; this
            # says which key it was without saying anything about it.
            "key_id": blake3(b"wiretape redaction key id", key=self._key).hexdigest(8),
            "headers": list(SECRET_HEADERS),
            "query_params": list(SECRET_QUERY_PARAMS),
            "patterns": list(dict.fromkeys(shape.name for shape in SHAPES)),
            "extra_patterns": list(self._extra),
        }

    def headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Header pairs with credentials replaced; names, order and duplicates kept."""
        return [(name, self._header_value(name.lower(), value)) for name, value in headers]

    def url(self, url: str) -> str:
        """The URL with secret query values and secret-shaped strings replaced, else unchanged."""
        return self._url(url)

    def body(self, data: bytes) -> bytes:
        """The body with secret-shaped strings replaced; `data` itself when there are none.

        `data` must be identity-encoded: see `decode_body`.
        """
        spans = self._matcher.spans(data)
        return self._splice(data, spans, 0) if spans else data

    def chunks(self, chunks: list[bytes]) -> list[bytes]:
        """Streamed blocks with no secret left in their concatenation.

        A secret that straddles block boundaries is found in the concatenation, and the blocks
        it touches are merged into one, so that its placeholder is never split. Every other
        boundary stays where it was; with nothing straddling, the count is unchanged.
        """
        return [data for _first, data in self.chunk_groups(chunks)]

    def chunk_groups(self, chunks: list[bytes]) -> list[tuple[int, bytes]]:
        """`chunks`, with the index of the first input block each output block comes from.

        A recorder uses the index to keep each block's arrival time when blocks were merged.
        """
        data = b"".join(chunks)
        spans = self._matcher.spans(data)
        if not spans:
            return list(enumerate(chunks))
        ends = []
        offset = 0
        for chunk in chunks:
            offset += len(chunk)
            ends.append(offset)
        glued = [False] * len(chunks)
        for start, end, _kind in spans:
            # Boundaries strictly inside the secret: the block ending there joins the next.
            index = bisect.bisect_right(ends, start)
            while index < len(ends) - 1 and ends[index] < end:
                glued[index] = True
                index += 1
        out = []
        first_chunk = 0
        group_start = 0
        first_span = 0
        for index, group_end in enumerate(ends):
            if glued[index]:
                continue
            # Spans are (start, end, kind): those starting before group_end lie in this group.
            last_span = bisect.bisect_left(spans, (group_end,), lo=first_span)
            if last_span > first_span:
                inside = spans[first_span:last_span]
                redacted = self._splice(data[group_start:group_end], inside, group_start)
                out.append((first_chunk, redacted))
            else:
                out.append((index, chunks[index]))  # only a secret glues blocks: this is alone
            first_chunk, group_start, first_span = index + 1, group_end, last_span
        return out

    # -- helpers ----------------------------------------------------------------------------

    def _redact_header_value(self, name: str, value: str) -> str:
        rule = _HEADER_RULES.get(name)
        if rule is not None:
            value = rule(value, self._seal_text)
        return self._text(value)

    def _redact_url(self, url: str) -> str:
        head, hash_sign, fragment = url.partition("#")
        path, question, query = head.partition("?")
        if query:
            query = "&".join(_query_param(part, self._seal_text) for part in query.split("&"))
        return self._text(path + question + query + hash_sign + fragment)

    def exchange(self, exchange: Exchange) -> Exchange:
        """A copy of `exchange` with every rule applied: what may go on a tape."""
        response = exchange.response
        if response is not None:
            chunks = None
            if response.chunks is not None:
                # Chunks a secret straddles come back merged, dated by the first of them.
                groups = self.chunk_groups([c.data for c in response.chunks])
                chunks = [Chunk(response.chunks[first].at_us, data) for first, data in groups]
            response = Response(
                response.status,
                response.reason,
                response.http_version,
                self.headers(response.headers),
                None if response.body is None else self.body(response.body),
                chunks,
                None if response.trailers is None else self.headers(response.trailers),
            )
        return replace(exchange, request=self.request(exchange.request), response=response)

    def request(self, request: Request) -> Request:
        """A copy of `request` with every rule applied."""
        return Request(
            request.method,
            self.url(request.url),
            request.http_version,
            self.headers(request.headers),
            self.body(request.body),
        )

    def _placeholder(self, kind: str, secret: bytes) -> bytes:
        tag = blake3(secret, key=self._key).hexdigest(TAG_BYTES)
        return f"[REDACTED:{kind}:{tag}]".encode("ascii")

    def _seal_text(self, kind: str, secret: str) -> str:
        """The placeholder for a credential found by name; its shape names it when it can."""
        raw = secret.encode("utf-8", "surrogateescape")
        return self._placeholder(_shape_of(raw) or kind, raw).decode("ascii")

    def _splice(self, data: bytes, spans: list[tuple[int, int, str]], base: int) -> bytes:
        parts = []
        position = 0
        for start, end, kind in spans:
            start -= base
            end -= base
            parts.append(data[position:start])
            parts.append(self._placeholder(kind, data[start:end]))
            position = end
        parts.append(data[position:])
        return b"".join(parts)

    def _text(self, text: str) -> str:
        # Header values and URLs arrive as str decoded the way mitmproxy decodes them.
        data = text.encode("utf-8", "surrogateescape")
        spans = self._matcher.spans(data)
        if not spans:
            return text
        return self._splice(data, spans, 0).decode("utf-8", "surrogateescape")


def scan_for_secrets(data: bytes, extra_patterns: Sequence[str] = ()) -> list[Finding]:
    """What in `data` still looks like a secret (placeholders do not), for `verify --secrets`."""
    findings = []
    for start, end, kind in _matcher(_pattern_list(extra_patterns)).spans(data):
        public = _PUBLIC_PREFIX.match(data, start, end)
        shown = public.group().decode("ascii") if public and public.end() < end else ""
        preview = f"{shown}…({end - start} bytes)"
        findings.append(Finding(kind=kind, offset=start, length=end - start, preview=preview))
    return findings


def load_or_create_key(home: Path) -> bytes:
    """The 32-byte redaction key kept in `home/redaction.key`, made on first use.

    The directory is created 0700 and the file 0600. The file appears complete or not at all,
    so two processes starting at once agree on one key.
    """
    path = home / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = _create_key(home, path)
    if len(key) != KEY_SIZE:
        raise ValueError(
            f"{path}: a redaction key is {KEY_SIZE} bytes, this file has {len(key)}; "
            "remove it to make a new key (tapes recorded with the old key then stop matching "
            "requests that carry secrets)"
        )
    return key


def _create_key(home: Path, path: Path) -> bytes:
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(home, 0o700)  # mkdir's mode is filtered by the umask
    temporary = home / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(secrets.token_bytes(KEY_SIZE))
            file.flush()
            os.fsync(file.fileno())
        with contextlib.suppress(FileExistsError):  # another process got there first
            os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return path.read_bytes()


# -- compressed bodies ----------------------------------------------------------------------


class UndecodableBody(ValueError):
    """A body whose Content-Encoding cannot be undone, so it cannot be redacted."""


def decode_body(data: bytes, content_encoding: str | None) -> bytes:
    """The body with its Content-Encoding undone, so that `Redactor.body` can see into it.

    `Redactor.body` reads bytes as they are and finds nothing inside a gzip or br body: decode
    first, and store what was redacted, the decoded body. Codings are undone last first, as
    `Content-Encoding: gzip, br` requires. Supported: identity, gzip, deflate (zlib or raw),
    br and zstd (br and zstd when their modules are installed; mitmproxy brings them).
    Anything else, or corrupt data, raises `UndecodableBody`, so that encoded bytes are never
    taken for redacted ones. The output size is not limited.
    """
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding listed was applied last
        decoder = _DECODERS.get(coding)
        if decoder is None:
            raise UndecodableBody(f"unsupported Content-Encoding {coding!r}")
        try:
            data = decoder(data)
        except Exception as exc:
            raise UndecodableBody(f"body is not valid {coding}: {exc}") from exc
    return data


def _gunzip(data: bytes) -> bytes:
    return zlib.decompress(data, wbits=16 + zlib.MAX_WBITS)


def _inflate(data: bytes) -> bytes:
    # "deflate" means zlib-wrapped data by the RFC, and raw deflate in some servers.
    try:
        return zlib.decompress(data)
    except zlib.error:
        return zlib.decompress(data, wbits=-zlib.MAX_WBITS)


def _unbrotli(data: bytes) -> bytes:
    import brotli

    return brotli.decompress(data)


def _unzstd(data: bytes) -> bytes:
    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        from backports import zstd
    return zstd.decompress(data)


_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda data: data,
    "gzip": _gunzip,
    "x-gzip": _gunzip,
    "deflate": _inflate,
    "br": _unbrotli,
    "zstd": _unzstd,
}


# -- rules by name --------------------------------------------------------------------------

Seal = Callable[[str, str], str]  # (kind, secret) -> placeholder


def _whole_value(value: str, seal: Seal) -> str:
    """x-api-key and the like: the value is the credential."""
    return _seal_core(value, HEADER_KIND, seal)


def _credentials(value: str, seal: Seal) -> str:
    """Authorization: keep the scheme word (`Bearer`, `Basic`), replace what follows it."""
    match = _SCHEME.match(value)
    if match is None:
        return _seal_core(value, HEADER_KIND, seal)
    return match.group(1) + _seal_core(match.group(2), HEADER_KIND, seal)


def _cookie_values(value: str, seal: Seal) -> str:
    """Cookie: keep each cookie's name, replace its value."""
    return ";".join(_cookie_pair(pair, seal) for pair in value.split(";"))


def _set_cookie_value(value: str, seal: Seal) -> str:
    """Set-Cookie: the first pair is the cookie; attributes (Path, Expires) stay readable."""
    pair, semicolon, attributes = value.partition(";")
    return _cookie_pair(pair, seal) + semicolon + attributes


def _cookie_pair(pair: str, seal: Seal) -> str:
    name, equals, value = pair.partition("=")
    if not equals:  # a pair without "=" is a cookie with an empty name (RFC 6265bis)
        return _seal_core(pair, COOKIE_KIND, seal)
    return name + equals + _seal_core(value, COOKIE_KIND, seal)


def _query_param(part: str, seal: Seal) -> str:
    name, equals, value = part.partition("=")
    if not (equals and value) or unquote_plus(name).lower() not in _SECRET_PARAM_SET:
        return part
    if PLACEHOLDER.fullmatch(value.encode("utf-8", "surrogateescape")):
        return part
    # The tag is of the decoded value, so a key gets one placeholder in URLs and bodies alike.
    return name + equals + seal(PARAM_KIND, unquote_plus(value))


def _seal_core(value: str, kind: str, seal: Seal) -> str:
    """Replace `value` but its surrounding blanks and quotes; leave placeholders alone."""
    match = _CORE.fullmatch(value)
    assert match is not None  # _CORE matches any string
    before, core, after = match.groups()
    if not core or PLACEHOLDER.fullmatch(core.encode("utf-8", "surrogateescape")):
        return value
    return before + seal(kind, core) + after


_SCHEME = re.compile(r"(\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+\s+)(\S.*)", re.DOTALL)
_CORE = re.compile(r'(\s*"?)(.*?)("?\s*)', re.DOTALL)
_SECRET_PARAM_SET = frozenset(SECRET_QUERY_PARAMS)
_HEADER_RULES: dict[str, Callable[[str, Seal], str]] = {
    "authorization": _credentials,
    "proxy-authorization": _credentials,
    "cookie": _cookie_values,
    "set-cookie": _set_cookie_value,
}
_HEADER_RULES.update({name: _whole_value for name in SECRET_HEADERS if name not in _HEADER_RULES})


def _shape_of(secret: bytes) -> str | None:
    """The shape a credential has on its own, to name its placeholder (`openai-key`)."""
    for form in _BARE_FORMS:
        if form.search.fullmatch(secret):
            return form.name
    return None


# -- the matcher ----------------------------------------------------------------------------

Span = tuple[int, int, str]  # start, end, kind


def _pattern_list(extra_patterns: Sequence[str]) -> tuple[str, ...]:
    if isinstance(extra_patterns, str):  # one pattern per character is never what was meant
        raise TypeError("extra_patterns is a list of patterns, not a single string")
    return tuple(extra_patterns)


@lru_cache(maxsize=32)
def _matcher(extra_patterns: tuple[str, ...]) -> _Matcher:
    return _Matcher(extra_patterns)


class _Matcher:
    """Finds the secrets in bytes: the shapes first, then each user pattern in turn."""

    def __init__(self, extra_patterns: tuple[str, ...]) -> None:
        self.custom = tuple(_compile_custom(pattern) for pattern in extra_patterns)

    def spans(self, data: bytes) -> list[Span]:
        """The secrets in `data`, in order, never overlapping each other or a placeholder."""
        shaped = data.translate(_RUN_MASK).find(_RUN_NEEDLE) >= 0
        if not shaped and not self.custom:
            return []
        opaque: list[tuple[int, int]] = []
        if _PLACEHOLDER_OPEN in data:
            opaque = [m.span() for m in PLACEHOLDER.finditer(data)]
        spans: list[Span] = []
        if shaped:
            lowered = data.lower()  # for the leads that match in any case; same offsets
            for start, end in _gaps(opaque, len(data)):
                spans.extend(_shaped_secrets(data, lowered, start, end))
        # A user pattern sees what is left, as if it ran on the output of the passes before it.
        for pattern in self.custom:
            taken = sorted(opaque + [(start, end) for start, end, _kind in spans])
            found = []
            for start, end in _gaps(taken, len(data)):
                found.extend(_custom_secrets(pattern, data, start, end))
            if found:
                spans = sorted(spans + found)
        return spans


def _shaped_secrets(data: bytes, lowered: bytes, start: int, end: int) -> list[Span]:
    """Every form searched on its own: a literal prefix each makes each pass quick."""
    found = []
    for form in _FORMS:
        if form.then is None:
            # A find is much cheaper than starting a regex search (and `in` on bytes is not).
            if data.find(form.literal, start, end) >= 0:
                for match in form.search.finditer(data, start, end):
                    found.append((match.start(1), form.rank, match.end(1), form.name))
        elif lowered.find(form.literal, start, end) >= 0:
            for lead in form.search.finditer(lowered, start, end):
                match = form.then.match(data, lead.end(), end)
                if match is not None:
                    found.append((match.start(), form.rank, match.end(), form.name))
    if not found:
        return []
    found.sort()
    # Forms overlap ("Bearer eyJ...", "sk-ant-..."): the union is redacted, under the name of
    # the form that starts first, the table's first at one start.
    first_start, _rank, first_end, first_name = found[0]
    spans = [(first_start, first_end, first_name)]
    for secret_start, _rank, secret_end, name in found[1:]:
        last_start, last_end, last_name = spans[-1]
        if secret_start < last_end:
            spans[-1] = (last_start, max(last_end, secret_end), last_name)
        else:
            spans.append((secret_start, secret_end, name))
    return spans


def _custom_secrets(pattern: re.Pattern[bytes], data: bytes, start: int, end: int) -> list[Span]:
    group = 1 if pattern.groups else 0
    found = []
    for match in pattern.finditer(data, start, end):
        secret_start, secret_end = match.span(group)
        if secret_end > secret_start:
            found.append((secret_start, secret_end, CUSTOM_KIND))
    return found


def _compile_custom(pattern: str) -> re.Pattern[bytes]:
    """A `--redact` pattern, matched against bytes; group 1, if it has groups, is the secret."""
    try:
        return re.compile(pattern.encode("utf-8"))
    except (re.error, UnicodeEncodeError) as exc:
        raise ValueError(
            f"--redact pattern {pattern!r} is not a valid regular expression: {exc}"
        ) from None


def _gaps(taken: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The stretches of [0, length) outside the sorted, disjoint spans `taken`."""
    gaps = []
    position = 0
    for start, end in taken:
        if start > position:
            gaps.append((position, start))
        position = max(position, end)
    if position < length:
        gaps.append((position, length))
    return gaps
