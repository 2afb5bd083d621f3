"""A fake LLM upstream: a real HTTP/1.1 server speaking the OpenAI and Anthropic wire formats.

The demo, the tests and the benchmarks use it as the real upstream (it is not part of what is
under test). On the wire it behaves like one: keep-alive, pipelining, Content-Length and chunked
request bodies, SSE streams written and flushed one event per HTTP chunk, optional TLS from a
throwaway CA of its own. Its answers are deterministic: the same request gets the same bytes,
and a changed prompt changes the answer.

How the fake model answers:

- Text is ``You said: <text of the last user message>``. When the last turn is a tool result,
  it is ``The tool returned: <result text>`` and no tool is called, so agent loops end.
- When the request offers tools (and the last turn is not a tool result, and tool choice is
  not "none"), the answer calls the forced tool, else the first one, with arguments built from
  its JSON schema: strings get the user's text, integers its word count, numbers its length in
  characters, booleans true, enums their first value, arrays [] and objects {}.
- Ids derive from a hash of the request body, ``created`` is a fixed timestamp, and token
  counts are request body bytes / 4 in and streamed pieces out.

Endpoints (the real APIs' field names, event names and SSE framing):

    POST /v1/chat/completions  OpenAI Chat Completions: JSON, or SSE with "stream": true
                               (stream_options.include_usage honoured; tools give tool_calls)
    POST /v1/responses         OpenAI Responses: JSON, or typed SSE events (response.created,
                               response.output_text.delta, ..., response.completed)
    POST /v1/messages          Anthropic Messages: JSON, or SSE (message_start ... message_stop,
                               with a ping); tools give tool_use blocks
    GET  /v1/models            the OpenAI model list

Test controls:

    GET  /fake/sse?events=N&interval_ms=M  N numbered SSE events (id: i, data: {"n":i,...})
    GET  /fake/bytes?size=N&seed=S         N deterministic bytes, `fake_bytes(N, S)`; the
                                           first byte is 0xFF, so never valid UTF-8
    ANY  /fake/echo                        the request as JSON: method, path, query, headers
                                           (pairs, in order) and body (text when UTF-8, else
                                           null) plus body_base64
    GET  /fake/reset?after=N               N SSE events, then a TCP reset (SO_LINGER 0, close)
    GET  /fake/hang                        reads the request and never answers
    GET  /fake/status?code=N               status N (200-599) with a small JSON error body
    GET  /fake/json?size=N                 a JSON document of about N bytes

SSE events are paced by the server's ``delay_ms`` (default 0, no pause), overridden per request
by the query parameter ``interval_ms`` or the header ``x-fake-interval-ms``; the pause comes
between events, not before the first.

Command line: ``python -m wiretape.fake_upstream [--tls] [--host H] [--port 0] [--delay-ms N]
[--cert-dir DIR]`` prints ``listening on <url>`` (then ``ca <path>`` with --tls) and serves
until SIGTERM or SIGINT, exiting 0.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import hashlib
import http
import os
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import orjson

from .threaded import ThreadedServer, loop_factory

__all__ = ["FakeUpstream", "ReceivedRequest", "fake_bytes", "main"]

# A fixed clock keeps answers byte-identical from run to run.
CREATED = 1_735_689_600  # 2025-01-01T00:00:00Z
FINGERPRINT = "fp_wiretape"
MODELS = (
    ("gpt-4o-mini", "system"),
    ("gpt-4o", "system"),
    ("gpt-4.1", "system"),
    ("o4-mini", "system"),
    ("claude-sonnet-4-6", "anthropic"),
    ("claude-haiku-4-5", "anthropic"),
)
STOP_TIMEOUT = 5.0

_SSE = "text/event-stream; charset=utf-8"
_JSON = "application/json"
_HEAD_LIMIT = 1 << 20
_COPY_LIMIT = 64 << 10
_MAX_SIZE = 256 << 20
_RESET_SETTLE = 0.05
_PIECE = re.compile(r"\s*\S+|\s+")
_REASONS = {status.value: status.phrase for status in http.HTTPStatus}


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request as the fake upstream read it off the wire (headers as sent, in order)."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The last value of header `name` (case-insensitive), or None."""
        name = name.lower()
        for key, value in reversed(self.headers):
            if key.lower() == name:
                return value
        return None

    def params(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)


class FakeUpstream(ThreadedServer):
    """The fake upstream server. Start it in a running loop, or in a thread of its own.

    `requests` and `request_count` may be read from any thread while it serves.
    """

    thread_name = "wiretape-fake-upstream"
    stop_timeout = STOP_TIMEOUT

    def __init__(
        self,
        *,
        tls: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_ms: float = 0,
        cert_dir: str | None = None,
        keep_requests: bool = True,
    ) -> None:
        self.tls = tls
        self.host = host
        self.port = port
        self.delay_ms = delay_ms
        self.cert_dir = cert_dir
        # Long benchmark runs would otherwise hold every body; the count is always kept.
        self.keep_requests = keep_requests
        self.ca_path: str | None = None
        self._lock = threading.Lock()
        self._requests: list[ReceivedRequest] = []
        self._request_count = 0
        self._connection_count = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._owned_dir: str | None = None
        self._routes: dict[str, tuple[tuple[str, ...], _Route]] = {
            "/v1/chat/completions": (("POST",), self._chat_completions),
            "/v1/responses": (("POST",), self._responses),
            "/v1/messages": (("POST",), self._messages),
            "/v1/models": (("GET",), self._models),
            "/fake/sse": (("GET",), self._sse),
            "/fake/bytes": (("GET",), self._bytes),
            "/fake/echo": (("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"), self._echo),
            "/fake/reset": (("GET",), self._reset),
            "/fake/hang": (("GET",), self._hang),
            "/fake/status": (("GET",), self._status),
            "/fake/json": (("GET",), self._json),
        }

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake upstream is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def request_count(self) -> int:
        with self._lock:
            return self._request_count

    @property
    def requests(self) -> list[ReceivedRequest]:
        """A snapshot of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def connection_count(self) -> int:
        """Connections accepted so far: with keep-alive, fewer than requests."""
        with self._lock:
            return self._connection_count

    def clear(self) -> None:
        """Forget the requests and connections counted so far."""
        with self._lock:
            self._requests.clear()
            self._request_count = 0
            self._connection_count = 0

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the fake upstream is already running")
        context = None
        if self.tls:
            directory = self.cert_dir
            if directory is None:
                directory = self._owned_dir = tempfile.mkdtemp(prefix="wiretape-fake-upstream-")
            else:
                os.makedirs(directory, exist_ok=True)
            self.ca_path, context = _tls_context(directory)
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=context, limit=_HEAD_LIMIT, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
        await asyncio.sleep(0)  # let the aborted transports run connection_lost
        # Before Python 3.13, wait_closed() also waits for connections still in their TLS
        # handshake, which no task of ours holds yet: a silent client would block the stop.
        # Such a connection is refused by _serve if its handshake ever completes.
        if hasattr(server, "abort_clients"):
            server.abort_clients()
            with suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), STOP_TIMEOUT)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # The connection loop.

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(reader, writer)
        if self._server is None:  # accepted while stopping
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            self._connection_count += 1
        try:
            while True:
                try:
                    request = await conn.read_request()
                except _ProtocolError as exc:
                    conn.keep_alive = False
                    await conn.respond(exc.status, _openai_error(exc.status, exc.message))
                    break
                if request is None:
                    break
                with self._lock:
                    self._request_count += 1
                    if self.keep_requests:
                        self._requests.append(request)
                await self._dispatch(request, conn)
                if not conn.keep_alive:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            conn.aborted = True  # the client went away, or sent an endless chunk-size line
        except asyncio.CancelledError:
            # Only stop() cancels a connection. Ending normally matters: on Python 3.12.1 the
            # stream protocol's done-callback calls task.exception(), which raises for a
            # cancelled task and prints a traceback.
            conn.aborted = True
        finally:
            self._tasks.discard(task)
            if conn.aborted:
                writer.transport.abort()
            else:
                writer.close()

    async def _dispatch(self, request: ReceivedRequest, conn: _Connection) -> None:
        route = self._routes.get(request.path)
        try:
            if route is None:
                raise _ClientError(404, f"no such endpoint: {request.path}", "not_found_error")
            methods, handler = route
            if request.method not in methods:
                raise _ClientError(405, f"{request.method} is not allowed on {request.path}")
            await handler(request, conn)
        except _ClientError as exc:
            if conn.head_sent:  # too late for a status: cut the body short instead
                conn.aborted = True
                conn.keep_alive = False
            else:
                await conn.respond(exc.status, _error_body(request.path, exc))
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A bug in the fake: answer 500 so a client fails at once instead of hanging.
            conn.keep_alive = False
            if conn.head_sent:
                conn.aborted = True
            else:
                error = _ClientError(500, f"fake upstream error: {exc!r}", "api_error")
                await conn.respond(500, _error_body(request.path, error))

    async def _stream(
        self,
        conn: _Connection,
        events: list[bytes],
        interval: float,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        await conn.open_stream(200, _SSE, headers)
        for index, event in enumerate(events):
            if index and interval:
                await asyncio.sleep(interval)
            await conn.send_chunk(event)
        await conn.close_stream()

    def _interval(self, request: ReceivedRequest) -> float:
        raw = _param(request, "interval_ms")
        if raw is None:
            raw = request.header("x-fake-interval-ms")
        if raw is None:
            return self.delay_ms / 1000
        try:
            milliseconds = float(raw)
        except ValueError:
            milliseconds = -1.0
        if not 0 <= milliseconds <= 600_000:
            raise _ClientError(400, f"interval_ms must be a number of ms (0-600000), not {raw!r}")
        return milliseconds / 1000

    # The LLM endpoints.

    async def _chat_completions(self, request: ReceivedRequest, conn: _Connection) -> None:
        payload = _json_payload(request.body)
        model = str(payload.get("model") or "gpt-4o-mini")
        ident = _digest(request.body)
        ask = _chat_ask(payload.get("messages"))
        tool = None if ask.from_tool else _chat_tool(payload)
        headers = (("x-request-id", f"req_{ident}"),)
        base = {
            "id": f"chatcmpl-{ident}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
        }
        if tool is None:
            text = ask.answer()
            pieces = _pieces(text)
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": [],
            }
            finish = "stop"
        else:
            name, arguments = tool
            pieces = _slices(arguments)
            call = {"id": f"call_{ident}", "type": "function"}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**call, "function": {"name": name, "arguments": arguments}}],
                "refusal": None,
                "annotations": [],
            }
            finish = "tool_calls"
        usage = _chat_usage(_prompt_tokens(request.body), len(pieces))
        if not payload.get("stream"):
            body = {
                **base,
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                ],
                "usage": usage,
                "service_tier": "default",
                "system_fingerprint": FINGERPRINT,
            }
            await conn.respond(200, orjson.dumps(body), headers=headers)
            return
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        base = {
            **base,
            "object": "chat.completion.chunk",
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            data: dict[str, Any] = {**base, "choices": [choice]}
            if include_usage:
                data["usage"] = None  # as the real API sends it on every chunk but the last
            return b"data: " + orjson.dumps(data) + b"\n\n"

        if tool is None:
            events = [chunk({"role": "assistant", "content": "", "refusal": None})]
            events.extend(chunk({"content": piece}) for piece in pieces)
        else:
            first_call = {**call, "index": 0, "function": {"name": tool[0], "arguments": ""}}
            opening = {"role": "assistant", "content": None, "tool_calls": [first_call]}
            events = [chunk({**opening, "refusal": None})]
            events.extend(
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                for piece in pieces
            )
        events.append(chunk({}, finish))
        if include_usage:
            events.append(
                b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            )
        events.append(b"data: [DONE]\n\n")
        await self._stream(conn, events, self._interval(request), headers)

    async def _responses(self, request: ReceivedRequest, conn: _Connection) -> None:
        payload = _json_payload(request.body)
        ident = _digest(request.body)
        ask = _responses_ask(payload.get("input"))
        tool = None if ask.from_tool else _responses_tool(payload)
        if tool is None:
            text = ask.answer()
            pieces = _pieces(text)
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            item: dict[str, Any] = {
                "id": f"msg_{ident}",
                "type": "message",
                "status": "completed",
                "content": [part],
                "role": "assistant",
            }
        else:
            name, arguments = tool
            pieces = _slices(arguments)
            item = {
                "id": f"fc_{ident}",
                "type": "function_call",
                "status": "completed",
                "arguments": arguments,
                "call_id": f"call_{ident}",
                "name": name,
            }
        input_tokens = _prompt_tokens(request.body)
        response = {
            "id": f"resp_{ident}",
            "object": "response",
            "created_at": CREATED,
            "status": "completed",
            "background": False,
            "completed_at": CREATED,
            "error": None,
            "incomplete_details": None,
            "instructions": payload.get("instructions"),
            "max_output_tokens": payload.get("max_output_tokens"),
            "model": str(payload.get("model") or "gpt-4o-mini"),
            "output": [item],
            "parallel_tool_calls": payload.get("parallel_tool_calls", True),
            "previous_response_id": payload.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": payload.get("store", True),
            "temperature": payload.get("temperature", 1.0),
            "text": payload.get("text") or {"format": {"type": "text"}},
            "tool_choice": payload.get("tool_choice", "auto"),
            "tools": payload.get("tools") or [],
            "top_p": payload.get("top_p", 1.0),
            "truncation": payload.get("truncation") or "disabled",
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(pieces),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + len(pieces),
            },
            "user": payload.get("user"),
            "metadata": payload.get("metadata") or {},
        }
        headers = (("x-request-id", f"req_{ident}"),)
        if not payload.get("stream"):
            await conn.respond(200, orjson.dumps(response), headers=headers)
            return
        events = _responses_events(response, item, pieces)
        await self._stream(conn, events, self._interval(request), headers)

    async def _messages(self, request: ReceivedRequest, conn: _Connection) -> None:
        payload = _json_payload(request.body)
        ident = _digest(request.body)
        ask = _anthropic_ask(payload.get("messages"))
        tool = None if ask.from_tool else _anthropic_tool(payload)
        if tool is None:
            text = ask.answer()
            pieces = _pieces(text)
            block: dict[str, Any] = {"type": "text", "text": text}
            stop_reason = "end_turn"
        else:
            name, arguments = tool
            pieces = _slices(arguments)
            block = {
                "type": "tool_use",
                "id": f"toolu_{ident}",
                "name": name,
                "input": orjson.loads(arguments),
            }
            stop_reason = "tool_use"
        usage = {
            "input_tokens": _prompt_tokens(request.body),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": len(pieces),
            "service_tier": "standard",
        }
        message = {
            "id": f"msg_{ident}",
            "type": "message",
            "role": "assistant",
            "model": str(payload.get("model") or "claude-sonnet-4-6"),
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        headers = (("request-id", f"req_{ident}"),)
        if not payload.get("stream"):
            await conn.respond(200, orjson.dumps(message), headers=headers)
            return
        events = _anthropic_events(message, block, pieces)
        await self._stream(conn, events, self._interval(request), headers)

    async def _models(self, request: ReceivedRequest, conn: _Connection) -> None:
        data = [
            {"id": name, "object": "model", "created": CREATED, "owned_by": owner}
            for name, owner in MODELS
        ]
        await conn.respond(200, orjson.dumps({"object": "list", "data": data}))

    # The test controls.

    async def _sse(self, request: ReceivedRequest, conn: _Connection) -> None:
        count = _int_param(request, "events", 3, 0, 1_000_000)
        await self._stream(conn, _numbered_events(count), self._interval(request))

    async def _bytes(self, request: ReceivedRequest, conn: _Connection) -> None:
        size = _int_param(request, "size", 1024, 0, _MAX_SIZE)
        seed = _int_param(request, "seed", 0, -(2**63), 2**63 - 1)
        await conn.respond(200, fake_bytes(size, seed), "application/octet-stream")

    async def _echo(self, request: ReceivedRequest, conn: _Connection) -> None:
        try:
            text: str | None = request.body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        echo = {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": [list(pair) for pair in request.headers],
            "body": text,
            "body_base64": base64.b64encode(request.body).decode("ascii"),
        }
        await conn.respond(200, orjson.dumps(echo))

    async def _reset(self, request: ReceivedRequest, conn: _Connection) -> None:
        count = _int_param(request, "after", 1, 0, 1_000_000)
        interval = self._interval(request)
        await conn.open_stream(200, _SSE)
        for index, event in enumerate(_numbered_events(count)):
            if index and interval:
                await asyncio.sleep(interval)
            await conn.send_chunk(event)
        # abort() drops what is still buffered here, and some stacks (Windows) drop unread
        # data when a reset arrives: let the events reach the client first.
        await conn.flushed()
        await asyncio.sleep(_RESET_SETTLE)
        sock = conn.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.aborted = True
        conn.keep_alive = False

    async def _hang(self, request: ReceivedRequest, conn: _Connection) -> None:
        # Hold the connection until the client gives up or the server stops.
        while await conn.reader.read(65536):
            pass
        conn.keep_alive = False

    async def _status(self, request: ReceivedRequest, conn: _Connection) -> None:
        code = _int_param(request, "code", 500, 200, 599)
        if code in (204, 304):
            await conn.respond(code, b"", None)
            return
        error = {"message": f"fake status {code}", "type": "fake_status", "code": code}
        await conn.respond(code, orjson.dumps({"error": error}))

    async def _json(self, request: ReceivedRequest, conn: _Connection) -> None:
        size = _int_param(request, "size", 1024, 0, _MAX_SIZE)
        await conn.respond(200, _json_document(size))


@functools.lru_cache(maxsize=8)
def fake_bytes(size: int, seed: int = 0) -> bytes:
    """The body of `/fake/bytes`: `size` pseudo-random bytes; a leading 0xFF breaks UTF-8."""
    data = random.Random(seed).randbytes(size)
    return b"\xff" + data[1:] if data else data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wiretape.fake_upstream",
        description="Serve the fake LLM upstream until SIGTERM or SIGINT.",
    )
    parser.add_argument("--tls", action="store_true", help="serve HTTPS from a throwaway CA")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--delay-ms", type=float, default=0, help="pause between SSE events")
    parser.add_argument("--cert-dir", help="where to write the CA and certificate (a temp dir)")
    args = parser.parse_args(argv)
    upstream = FakeUpstream(
        tls=args.tls,
        host=args.host,
        port=args.port,
        delay_ms=args.delay_ms,
        cert_dir=args.cert_dir,
        keep_requests=False,  # nobody can read them from outside the process
    )
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve_until_signalled(upstream))
    return 0


# The HTTP/1.1 layer.

type _Route = Callable[[ReceivedRequest, _Connection], Awaitable[None]]


class _ProtocolError(Exception):
    """The bytes on the wire are not a request this server can read."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _ClientError(Exception):
    """A well-formed request the endpoint refuses; becomes a JSON error in the API's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class _Connection:
    """One client connection: reads its requests and writes the responses."""

    __slots__ = ("aborted", "chunked", "head_sent", "keep_alive", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.keep_alive = True
        self.chunked = True
        self.head_sent = False
        self.aborted = False

    async def read_request(self) -> ReceivedRequest | None:
        """The next request, or None when the client closed the connection between requests."""
        head = b""
        while not head:
            try:
                head = await self.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip():
                    raise _ProtocolError(400, "incomplete request head") from None
                return None
            except asyncio.LimitOverrunError:
                raise _ProtocolError(431, "request head too large") from None
            # Stray blank lines between requests are allowed (RFC 9112, section 2.2).
            head = head.lstrip(b"\r\n")
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _ProtocolError(400, "malformed request line")
        method = parts[0].decode("latin-1")
        target = parts[1].decode("latin-1")
        if target.startswith(("http://", "https://")):  # absolute form, as sent to a proxy
            target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
        path, _, query = target.partition("?")
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or line[0] in b" \t" or name[-1] in b" \t":
                raise _ProtocolError(400, "malformed header line")
            headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
        fields = {name.lower(): value for name, value in headers}
        http11 = parts[2] == b"HTTP/1.1"
        self.chunked = http11
        self.head_sent = False
        tokens = {token.strip() for token in fields.get("connection", "").lower().split(",")}
        self.keep_alive = http11 and "close" not in tokens
        body = await self._read_body(fields, http11)
        return ReceivedRequest(method, path, query, tuple(headers), body)

    async def _read_body(self, fields: dict[str, str], http11: bool) -> bytes:
        encoding = fields.get("transfer-encoding")
        length = fields.get("content-length")
        if encoding is not None:
            if encoding.lower().rsplit(",", 1)[-1].strip() != "chunked":
                raise _ProtocolError(400, f"unsupported transfer-encoding {encoding!r}")
            self._continue(fields, http11)
            return await self._read_chunked()
        if length is None:
            return b""
        if not (length.isascii() and length.isdigit()):
            raise _ProtocolError(400, f"malformed content-length {length!r}")
        size = int(length)
        if not size:
            return b""
        self._continue(fields, http11)
        return await self.reader.readexactly(size)

    def _continue(self, fields: dict[str, str], http11: bool) -> None:
        # curl and others wait for this before sending a large body.
        if http11 and fields.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _read_chunked(self) -> bytes:
        parts = []
        while True:
            line = await self.reader.readuntil(b"\r\n")
            try:
                size = int(line[:-2].split(b";", 1)[0].strip(), 16)
            except ValueError:
                size = -1
            if size < 0:
                raise _ProtocolError(400, "malformed chunk size")
            if size == 0:
                break
            parts.append(await self.reader.readexactly(size))
            if await self.reader.readexactly(2) != b"\r\n":
                raise _ProtocolError(400, "chunk not followed by CRLF")
        while await self.reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailer fields are read and dropped
        return b"".join(parts)

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str | None = _JSON,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        framing = None if status in (204, 304) else f"content-length: {len(body)}"
        head = self._head(status, content_type, framing, headers)
        if len(body) > _COPY_LIMIT:
            self.writer.writelines((head, body))
        else:  # one send is cheaper than a gather-write for the common small answer
            self.writer.write(head + body)
        await self.writer.drain()

    async def open_stream(
        self, status: int, content_type: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        if self.chunked:
            framing = "transfer-encoding: chunked"
        else:  # an HTTP/1.0 client: the body ends when the connection does
            framing = None
            self.keep_alive = False
        more = (*headers, ("cache-control", "no-cache"))
        self.writer.write(self._head(status, content_type, framing, more))
        await self.writer.drain()

    async def send_chunk(self, data: bytes) -> None:
        """Write `data` as one HTTP chunk in one write, so its boundary survives on the wire."""
        self.writer.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        await self.writer.drain()

    async def close_stream(self) -> None:
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()

    async def flushed(self, timeout: float = 1.0) -> None:
        """Wait until the transport has handed everything written to the kernel."""
        transport = self.writer.transport
        for _ in range(int(timeout / 0.001)):
            if not transport.get_write_buffer_size():
                return
            await asyncio.sleep(0.001)

    def _head(
        self,
        status: int,
        content_type: str | None,
        framing: str | None,
        headers: Iterable[tuple[str, str]],
    ) -> bytes:
        self.head_sent = True
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        if content_type is not None:
            lines.append(f"content-type: {content_type}")
        if framing is not None:
            lines.append(framing)
        lines.extend(f"{name}: {value}" for name, value in headers)
        if not self.keep_alive:
            lines.append("connection: close")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")


# What the fake model is asked, and how it answers.


@dataclass(frozen=True, slots=True)
class _Ask:
    text: str
    from_tool: bool

    def answer(self) -> str:
        return f"The tool returned: {self.text}" if self.from_tool else f"You said: {self.text}"


def _json_payload(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _ClientError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _ClientError(400, "the request body must be a JSON object")
    return payload


def _text_of(content: object) -> str:
    """The text of a message content: a string, or a list of parts that carry `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _chat_ask(messages: object) -> _Ask:
    if not isinstance(messages, list) or not messages:
        return _Ask("", False)
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "tool":
        return _Ask(_text_of(last.get("content")), True)
    return _Ask(_last_user_text(messages), False)


def _anthropic_ask(messages: object) -> _Ask:
    if not isinstance(messages, list) or not messages:
        return _Ask("", False)
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list):
        results = [
            _text_of(block.get("content"))
            for block in content
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
        if results:
            return _Ask("\n".join(results), True)
    return _Ask(_last_user_text(messages), False)


def _responses_ask(items: object) -> _Ask:
    if isinstance(items, str):
        return _Ask(items, False)
    if not isinstance(items, list) or not items:
        return _Ask("", False)
    last = items[-1]
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return _Ask(_text_of(last.get("output")), True)
    return _Ask(_last_user_text(items), False)


def _chat_tool(payload: dict[str, Any]) -> tuple[str, str] | None:
    choice = payload.get("tool_choice")
    if choice == "none":
        return None
    tools = [
        (tool["function"].get("name"), tool["function"].get("parameters"))
        for tool in payload.get("tools") or ()
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    return _pick_tool(tools, forced, _last_user_text(payload.get("messages") or []))


def _responses_tool(payload: dict[str, Any]) -> tuple[str, str] | None:
    choice = payload.get("tool_choice")
    if choice == "none":
        return None
    tools = [
        (tool.get("name"), tool.get("parameters"))
        for tool in payload.get("tools") or ()
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    forced = choice.get("name") if isinstance(choice, dict) else None
    return _pick_tool(tools, forced, _responses_ask(payload.get("input")).text)


def _anthropic_tool(payload: dict[str, Any]) -> tuple[str, str] | None:
    choice = payload.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "none":
        return None
    tools = [
        (tool.get("name"), tool.get("input_schema"))
        for tool in payload.get("tools") or ()
        if isinstance(tool, dict) and "input_schema" in tool  # server tools have no schema
    ]
    forced = choice.get("name") if isinstance(choice, dict) else None
    return _pick_tool(tools, forced, _last_user_text(payload.get("messages") or []))


def _pick_tool(tools: list[tuple[Any, Any]], forced: object, text: str) -> tuple[str, str] | None:
    """The tool to call (the forced one, else the first) and its arguments as a JSON string."""
    if not tools:
        return None
    name, schema = next((tool for tool in tools if tool[0] == forced), tools[0])
    properties = schema.get("properties") if isinstance(schema, dict) else None
    arguments = {}
    if isinstance(properties, dict):
        for key, spec in properties.items():
            arguments[key] = _sample_value(spec if isinstance(spec, dict) else {}, text)
    return str(name), orjson.dumps(arguments).decode()


def _sample_value(spec: dict[str, Any], text: str) -> object:
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    samples = {
        "integer": len(text.split()),
        "number": float(len(text)),
        "boolean": True,
        "array": [],
        "object": {},
        "null": None,
    }
    return samples.get(kind, text) if isinstance(kind, str) else text


def _pieces(text: str) -> list[str]:
    """Token-ish pieces: each word with the whitespace before it; they join back to `text`."""
    return _PIECE.findall(text)


def _slices(text: str, width: int = 8) -> list[str]:
    return [text[start : start + width] for start in range(0, len(text), width)] or [""]


def _digest(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=12).hexdigest()


def _prompt_tokens(body: bytes) -> int:
    return max(1, len(body) // 4)


def _chat_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _sse(data: dict[str, Any], event: str) -> bytes:
    return b"event: " + event.encode("ascii") + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _responses_events(
    response: dict[str, Any], item: dict[str, Any], pieces: list[str]
) -> list[bytes]:
    """The typed events of a streamed Responses call, in the order the real API sends them."""
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(_sse({"type": kind, "sequence_number": len(events), **fields}, kind))

    pending = {**response, "status": "in_progress", "completed_at": None, "output": []}
    pending["usage"] = None
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    where = {"item_id": item["id"], "output_index": 0}
    if item["type"] == "message":
        emit(
            "response.output_item.added",
            output_index=0,
            item={**item, "status": "in_progress", "content": []},
        )
        part = item["content"][0]
        emit("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
        for piece in pieces:
            emit("response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[])
        emit("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
        emit("response.content_part.done", **where, content_index=0, part=part)
    else:
        emit(
            "response.output_item.added",
            output_index=0,
            item={**item, "status": "in_progress", "arguments": ""},
        )
        for piece in pieces:
            emit("response.function_call_arguments.delta", **where, delta=piece)
        emit("response.function_call_arguments.done", **where, arguments=item["arguments"])
    emit("response.output_item.done", output_index=0, item=item)
    emit("response.completed", response=response)
    return events


def _anthropic_events(
    message: dict[str, Any], block: dict[str, Any], pieces: list[str]
) -> list[bytes]:
    """The events of a streamed Messages call, in the order the real API sends them."""
    usage = message["usage"]
    opening = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    if block["type"] == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
    else:
        empty = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
    events = [
        _sse({"type": "message_start", "message": opening}, "message_start"),
        _sse(
            {"type": "content_block_start", "index": 0, "content_block": empty},
            "content_block_start",
        ),
        _sse({"type": "ping"}, "ping"),
    ]
    events.extend(
        _sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
        for delta in deltas
    )
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events += [
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": stop,
                "usage": {"output_tokens": usage["output_tokens"]},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]
    return events


def _numbered_events(count: int) -> list[bytes]:
    return [b'id: %d\ndata: {"n":%d,"of":%d}\n\n' % (n, n, count) for n in range(count)]


@functools.lru_cache(maxsize=8)
def _json_document(size: int) -> bytes:
    """A JSON object of about `size` bytes (at least a dozen): records, then padding."""
    items = []
    length = len(b'{"items":[],"padding":""}')
    index = 0
    while True:
        item = b'{"id":%d,"name":"item-%d","tags":["fake","upstream"],"score":%d}' % (
            index,
            index,
            index * 7919 % 1000,
        )
        if length + len(item) + 1 > size:
            break
        items.append(item)
        length += len(item) + 1
        index += 1
    padding = b"x" * max(0, size - length)
    return b'{"items":[' + b",".join(items) + b'],"padding":"' + padding + b'"}'


def _param(request: ReceivedRequest, name: str) -> str | None:
    if not request.query:
        return None
    values = request.params().get(name)
    return values[-1] if values else None


def _int_param(request: ReceivedRequest, name: str, default: int, low: int, high: int) -> int:
    raw = _param(request, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise _ClientError(400, f"{name} must be an integer from {low} to {high}, not {raw!r}")
    return value


def _openai_error(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    error = {"message": message, "type": kind, "param": None, "code": None}
    return orjson.dumps({"error": error})


def _error_body(path: str, error: _ClientError) -> bytes:
    """The error in the shape of the API the path belongs to."""
    if path.startswith("/v1/messages"):
        return orjson.dumps(
            {"type": "error", "error": {"type": error.kind, "message": error.message}}
        )
    return _openai_error(error.status, error.message, error.kind)


# TLS.


def _tls_context(directory: str) -> tuple[str, ssl.SSLContext]:
    """Issue a throwaway CA and a leaf for localhost, 127.0.0.1 and ::1 into `directory`.

    Returns the CA's path and a server context offering only http/1.1 over ALPN.
    """
    # cryptography costs about 0.13 s to import: only TLS servers pay it.
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)
    start, end = now - timedelta(hours=1), now + timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "wiretape"),
            x509.NameAttribute(NameOID.COMMON_NAME, "wiretape fake upstream CA"),
        ]
    )
    ca_key_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): key usage, key ids and critical
    # basic constraints must all be present, so every extension below is needed.
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(x509, key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(ca_key_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(x509, digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path = os.path.join(directory, "fake-upstream-ca.pem")
    cert_path = os.path.join(directory, "fake-upstream-cert.pem")
    key_path = os.path.join(directory, "fake-upstream-key.pem")
    with open(ca_path, "wb") as file:
        file.write(ca_cert.public_bytes(pem))
    with open(cert_path, "wb") as file:
        file.write(leaf_cert.public_bytes(pem))
    key_bytes = leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key_bytes)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_path, key_path)
    context.set_alpn_protocols(["http/1.1"])
    return ca_path, context


def _key_usage(x509: Any, **allowed: bool) -> Any:
    usages = (
        "digital_signature",
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "key_cert_sign",
        "crl_sign",
        "encipher_only",
        "decipher_only",
    )
    return x509.KeyUsage(**{usage: allowed.get(usage, False) for usage in usages})


# Event loops.


async def _serve_until_signalled(upstream: FakeUpstream) -> None:
    await upstream.start()
    print(f"listening on {upstream.url}", flush=True)
    if upstream.ca_path is not None:
        print(f"ca {upstream.ca_path}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        await upstream.stop()


if __name__ == "__main__":
    sys.exit(main())
