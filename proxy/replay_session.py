"""`wiretape replay` and `wiretape serve`: a tape, the replayer, the server and a verdict."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from .child import run_child, wait_for_stop_signal
from .client_shims.environment import client_environment
from .matching import MatchRules
from .redact import Redactor, load_or_create_key
from .replay import Replayer
from .replay_server import ReplayServer
from .summary import format_line, summarize
from .tapes import Exchange, Request, TapeError
from .threaded import loop_factory

EXIT_DIVERGED = 1
EXIT_USAGE = 2
EXIT_TAPE_INVALID = 3


class ReplayError(Exception):
    """A problem reported as one line, with the exit code to leave with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class ReplayConfig:
    tape: Path
    home: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    reverse: str | None = None
    pace: float | None = None
    rules: MatchRules = field(default_factory=MatchRules)
    strict_order: bool = False
    allow_repeats: bool = False
    record_new: Path | None = None  # set: misses go upstream and onto this tape
    upstream_ca: Path | None = None
    report: Path | None = None
    quiet: bool = False


def replay_session(config: ReplayConfig, command: list[str]) -> int:
    """Serve the tape; run `command` against it, or serve until a stop signal."""
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(_replay(config, command))
    except ReplayError as exc:
        print(f"wiretape: {exc}", file=sys.stderr)
        return exc.code


async def _replay(config: ReplayConfig, command: list[str]) -> int:
    replayer = _load(config)
    forwarder = _forwarder(config, replayer.redactor) if config.record_new else None

    async def answer(request: Request) -> Exchange:
        exchange = replayer.lookup(request)
        outcome = "replayed"
        if exchange.source == "injected":
            outcome = "NO RECORDING"
            if forwarder is not None:
                exchange, outcome = await forwarder.forward(request), "forwarded"
        if not config.quiet:
            _announce(replayer.requests, outcome, request, exchange)
        return exchange

    server = ReplayServer(
        answer,
        home=config.home,
        host=config.listen_host,
        port=config.listen_port,
        reverse=config.reverse,
        pace=config.pace,
    )
    try:
        await server.start()
    except OSError as exc:
        raise ReplayError(
            f"cannot listen on {config.listen_host}:{config.listen_port}: {exc.strerror}",
            EXIT_USAGE,
        ) from None
    if config.reverse is None:  # proxy mode: clients will tunnel with CONNECT and TLS
        asyncio.get_running_loop().run_in_executor(None, _prepare_tls, server)
    try:
        if command:
            env = dict(os.environ)
            env.update(client_environment(server.url, config.reverse, config.home))
            try:
                code = await run_child(command, env)
            except OSError as exc:
                raise ReplayError(f"cannot run {command[0]}: {exc.strerror}", EXIT_USAGE) from None
        else:
            # The first line on stdout is the address, for scripts that pass port 0.
            print(server.url, flush=True)
            if not config.quiet:
                _print_usage(server, config)
            await wait_for_stop_signal()
            code = 0
    finally:
        await server.stop()
        if forwarder is not None:
            await forwarder.close()
    report = replayer.report()
    replayer.close()
    if config.record_new is not None:
        report.extra["forwarded_to"] = str(config.record_new)
    print(report.to_text(), file=sys.stderr, flush=True)
    if config.report is not None:
        config.report.write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    return EXIT_DIVERGED if report.diverged else code


def _prepare_tls(server: ReplayServer) -> None:
    # A failure here shows again, and is reported, on the first tunnel that needs it.
    with contextlib.suppress(Exception):
        server.prepare_tls()


def _load(config: ReplayConfig) -> Replayer:
    """Verify and index the whole tape before anything is served: bad tapes exit 3."""
    try:
        redactor = Redactor(load_or_create_key(config.home))
        return Replayer(
            config.tape,
            redactor,
            config.rules,
            allow_repeats=config.allow_repeats,
            strict_order=config.strict_order,
        )
    except TapeError as exc:
        raise ReplayError(str(exc), EXIT_TAPE_INVALID) from None
    except OSError as exc:
        raise ReplayError(f"cannot read {config.tape}: {exc.strerror}", EXIT_USAGE) from None


def _forwarder(config: ReplayConfig, redactor: Redactor):
    from .forwarder import Forwarder
    from .tapes import TapeExistsError, TapeWriter

    assert config.record_new is not None
    try:
        writer = TapeWriter(
            config.record_new,
            redaction=redactor.policy(),
            meta={"mode": "forwarded-misses", "base_tape": str(config.tape)},
        )
    except TapeExistsError as exc:
        raise ReplayError(str(exc), EXIT_USAGE) from None
    except OSError as exc:
        raise ReplayError(
            f"cannot create {config.record_new}: {exc.strerror}", EXIT_USAGE
        ) from None
    return Forwarder(writer, redactor, upstream_ca=config.upstream_ca)


def _announce(position: int, outcome: str, request: Request, exchange: Exchange) -> None:
    if outcome == "NO RECORDING":
        detail = f"{request.method} {request.url}"
    else:
        detail = format_line(summarize(exchange))
    print(f"wiretape: request {position} {outcome}: {detail}", file=sys.stderr, flush=True)


def _print_usage(server: ReplayServer, config: ReplayConfig) -> None:
    host, port = server.address
    lines = [f"wiretape: serving {config.tape} on {server.url}"]
    if config.reverse:
        lines.append(f"  base-URL mode for {config.reverse}: point the client at {server.url}")
        flags = f"--listen {host}:{port} --reverse {config.reverse}"
    else:
        flags = f"--listen {host}:{port}"
    lines.append(f'  in the agent\'s shell: eval "$(wiretape env {flags})"')
    lines.append("  Ctrl-C or SIGTERM stops it and prints the divergence report.")
    print("\n".join(lines), file=sys.stderr, flush=True)
