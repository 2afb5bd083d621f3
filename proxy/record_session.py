"""`wiretape record`: wire the tape, the redactor, the proxy and the user's command together."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

from .child import run_child, wait_for_stop_signal
from .client_shims.environment import client_environment
from .recording import RecordingConfig, RecordingError, RecordingProxy
from .redact import Redactor, load_or_create_key
from .summary import format_line, summarize
from .tapes import TapeExistsError, TapeWriter

EXIT_USAGE = 2


class SessionError(Exception):
    """A problem with the user's input, reported as one line and exit 2."""


def record_session(config: RecordingConfig, command: list[str], *, quiet: bool) -> int:
    try:
        return asyncio.run(_record(config, command, quiet))
    except SessionError as exc:
        print(f"wiretape: {exc}", file=sys.stderr)
        return EXIT_USAGE


async def _record(config: RecordingConfig, command: list[str], quiet: bool) -> int:
    _check_listen_address(config.listen_host, config.listen_port)
    try:
        redactor = Redactor(load_or_create_key(config.home), config.redact)
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    writer = _open_tape(config, redactor)

    def announce(exchange) -> None:
        print(f"wiretape: {format_line(summarize(exchange))}", file=sys.stderr, flush=True)

    proxy = RecordingProxy(config, redactor, writer, None if quiet else announce)
    try:
        await proxy.start()
    except RecordingError as exc:
        if not config.overwrite:
            config.tape.unlink(missing_ok=True)  # ours, and empty
        raise SessionError(str(exc)) from None
    errors = _ProxyErrors()
    logging.getLogger("mitmproxy").addHandler(errors)
    try:
        env = dict(os.environ)
        env.update(client_environment(proxy.url, config.reverse, config.home))
        if command:
            try:
                code = await run_child(command, env)
            except OSError as exc:
                raise SessionError(f"cannot run {command[0]}: {exc.strerror}") from None
        else:
            _print_usage(proxy, config)
            await wait_for_stop_signal()
            code = 0
    finally:
        await proxy.stop()
        logging.getLogger("mitmproxy").removeHandler(errors)
    if not quiet:
        print(
            f"wiretape: sealed {config.tape}: {writer.exchanges} exchange(s)",
            file=sys.stderr,
        )
    return code


def _open_tape(config: RecordingConfig, redactor: Redactor) -> TapeWriter:
    meta = {"mode": "reverse" if config.reverse else "proxy"}
    if config.reverse:
        meta["upstream"] = config.reverse
    try:
        return TapeWriter(
            config.tape,
            redaction=redactor.policy(),
            meta=meta,
            fsync=config.fsync,
            overwrite=config.overwrite,
        )
    except TapeExistsError as exc:
        raise SessionError(str(exc)) from None
    except OSError as exc:
        raise SessionError(f"cannot create {config.tape}: {exc.strerror}") from None


def _check_listen_address(host: str, port: int) -> None:
    """Fail before the tape is touched if the address cannot be had."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SessionError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _print_usage(proxy: RecordingProxy, config: RecordingConfig) -> None:
    host, port = proxy.address or ("127.0.0.1", 0)
    lines = [f"wiretape: recording to {config.tape}, listening on {proxy.url}"]
    if config.reverse:
        lines.append(f"  base-URL mode for {config.reverse}: point the client at {proxy.url}")
        lines.append(f'  eval "$(wiretape env --listen {host}:{port} --reverse {config.reverse})"')
    else:
        lines.append("  in the agent's shell:")
        lines.append(f'  eval "$(wiretape env --listen {host}:{port})"')
    lines.append("  Ctrl-C or SIGTERM stops and seals the tape.")
    print("\n".join(lines), file=sys.stderr, flush=True)


class _ProxyErrors(logging.Handler):
    """mitmproxy's errors while recording, as wiretape lines on stderr."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        print(f"wiretape: proxy error: {record.getMessage()}", file=sys.stderr, flush=True)
