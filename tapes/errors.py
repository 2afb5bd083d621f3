"""The one error hierarchy for reading, verifying and writing tapes."""

from __future__ import annotations


class TapeError(Exception):
    """A tape cannot be trusted as it is. Carries the path and the line (1-based) at fault."""

    def __init__(self, path: str, line: int | None, detail: str) -> None:
        self.path = path
        self.line = line
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: line {self.line}" if self.line is not None else self.path
        return f"{where}: {self.detail}"


class TapeFormatError(TapeError):
    """A line is not a well-formed record of the format."""


class NotATapeError(TapeFormatError):
    """The first line is not a wiretape header: some other file was given."""


class UnknownVersionError(TapeError):
    """The header names a format version this reader does not know."""

    def __init__(self, path: str, version: object, supported: int) -> None:
        self.version = version
        super().__init__(
            path,
            1,
            f"unknown tape format version {version!r} (this wiretape reads version "
            f"{supported}; a newer wiretape may have written it)",
        )


class BrokenChainError(TapeError):
    """A record's hash is not the hash of its bytes chained to the previous record's."""

    def __init__(self, path: str, line: int, expected: str, found: str) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            path,
            line,
            f"broken hash chain: expected {expected}, found {found} "
            "(the tape was edited, reordered or had records removed)",
        )


class TruncatedTapeError(TapeError):
    """The tape stops before its end record: a crash or a cut. Its intact prefix is valid."""

    def __init__(
        self,
        path: str,
        line: int,
        intact_exchanges: int,
        intact_bytes: int,
        chain_head: bytes = bytes(32),
    ) -> None:
        self.intact_exchanges = intact_exchanges
        self.intact_bytes = intact_bytes
        self.chain_head = chain_head
        if intact_bytes == 0:
            detail = "truncated inside the header: nothing intact to recover"
        else:
            detail = (
                f"truncated: not sealed; {intact_exchanges} intact exchange"
                f"{'' if intact_exchanges == 1 else 's'} before it "
                "(`wiretape verify --repair` keeps them and seals the tape)"
            )
        super().__init__(path, line, detail)


class TapeExistsError(FileExistsError):
    """A writer refused to replace an existing tape."""
