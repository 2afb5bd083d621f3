"""Serve an asyncio server from a thread of its own, for synchronous callers such as tests.

Both of wiretape's own servers (the replay server and the fake upstream) have `async start()`
and `async stop()`; this mixin adds `start_in_thread()`, `stop_thread()` and `with` around them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Self

START_TIMEOUT = 10.0


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class ThreadedServer:
    """Mixin: serve from a daemon thread with its own event loop."""

    thread_name = "wiretape-server"
    stop_timeout = 5.0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def start_in_thread(self) -> Self:
        """Returns once the server listens; its handlers then run on that thread."""
        if self._thread is not None:
            raise RuntimeError(f"{self.thread_name} is already running in a thread")
        loop = loop_factory()()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                started.set_exception(exc)
                loop.close()
                return
            started.set_result(None)
            try:
                loop.run_forever()
            finally:
                _cancel_leftovers(loop)
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        try:
            started.result(timeout=START_TIMEOUT)
        except BaseException:
            self._loop = self._thread = None
            raise
        return self

    def stop_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        try:
            stopped = asyncio.run_coroutine_threadsafe(self.stop(), loop)
            with suppress(TimeoutError):
                stopped.result(timeout=2 * self.stop_timeout + 1)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=self.stop_timeout)

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop_thread()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    # A handler still waiting when the loop stops would be destroyed pending, with a warning.
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
