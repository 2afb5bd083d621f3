"""Run the user's command under wiretape and pass signals on to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys


async def run_child(command: list[str], env: dict[str, str]) -> int:
    """Run `command` with `env`, wait for it, and return the exit code a shell would give.

    SIGTERM and SIGHUP are passed on to the child. So is SIGINT, unless stdin is a terminal:
    then Ctrl-C already reached the child, which shares our process group, and sending it a
    second one could cut its own clean-up short.
    """
    process = await asyncio.create_subprocess_exec(*command, env=env)
    loop = asyncio.get_running_loop()
    forwarded = [signal.SIGTERM, signal.SIGHUP]
    if not sys.stdin.isatty():
        forwarded.append(signal.SIGINT)
    else:
        loop.add_signal_handler(signal.SIGINT, lambda: None)
    for signum in forwarded:
        loop.add_signal_handler(signum, _forward, process, signum)
    try:
        returncode = await process.wait()
    finally:
        for signum in {*forwarded, signal.SIGINT}:
            loop.remove_signal_handler(signum)
    return 128 - returncode if returncode < 0 else returncode


async def wait_for_stop_signal() -> int:
    """Wait until SIGINT or SIGTERM arrives; return its number."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[int] = loop.create_future()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, lambda s=signum: received.done() or received.set_result(s))
    try:
        return await received
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
