"""The replay server's network layer: serves the exchanges a handler picks, byte-exact and paced.

Why wiretape's own server and not mitmproxy (DESIGN.md, "Why two engines"): replay must start
at once, stream recorded chunks at their recorded offsets, answer tens of thousands of requests
a second, and have no code path to an upstream. So it is an `asyncio.Protocol` over httptools'
parser that terminates `CONNECT` tunnels with TLS from wiretape's CA, serves absolute-form
proxy requests, and, with `reverse`, plain origin-form requests for base-URL mode. Which
recorded exchange answers a request is the handler's business, not this module's.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import socket
import ssl
import struct
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httptools
import orjson

from .tapes import Exchange, Request, Response
from .threaded import ThreadedServer, loop_factory

if TYPE_CHECKING:
    from .certificates import LeafIssuer

__all__ = ["Handler", "ReplayServer", "loop_factory"]

Handler = Callable[[Request], Awaitable[Exchange]]

STOP_TIMEOUT = 2.0
# A client that pipelines without reading its answers is stopped here, not buffered forever.
MAX_PIPELINED = 64
# How long a reset waits for the partial body to leave the kernel: the reset discards the rest.
RESET_FLUSH_TIMEOUT = 1.0
# Event-loop timers fire on a millisecond grid, up to 1 ms late: aiming half a millisecond
# early centres a paced chunk on its recorded offset.
TIMER_LEAD = 0.0005

DEFAULT_PORTS = {"http": 80, "https": 443}
# Per-connection headers describe the recorded connection, not this one; the framing
# (Content-Length or chunked) is rewritten for what is actually sent.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)
DROPPED_HEADERS = HOP_BY_HOP | {"content-length"}
# The failures after which the stream was cut, rather than closed or never opened.
RESET_KINDS = frozenset({"reset", "protocol", "aborted"})

TLS_HANDSHAKE = 0x16  # the first byte of a TLS record carrying a ClientHello
H2_PREFACE = b"PRI * HTTP/2.0"

# How an answer's body is delimited, besides a Content-Length (any int >= 0).
CHUNKED = -1
UNTIL_CLOSE = -2  # for HTTP/1.0 clients, which cannot read chunked framing
NO_BODY = -3  # HEAD, 204, 304

_log = logging.getLogger(__name__)
_REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_TIOCOUTQ = 0x5411  # Linux: bytes the kernel has not yet sent on a socket
_LINGER_RESET = struct.pack("ii", 1, 0)


def _h2_frame(kind: int, payload: bytes) -> bytes:
    """An HTTP/2 frame on stream 0 without flags (RFC 9113, 4.1)."""
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + bytes(4) + payload


# An empty SETTINGS frame, then GOAWAY (last stream 0, HTTP_1_1_REQUIRED): how an HTTP/2
# endpoint tells a prior-knowledge client to use HTTP/1.1 instead (RFC 9113, 7).
H2_USE_HTTP11 = _h2_frame(0x4, b"") + _h2_frame(0x7, bytes(4) + (0xD).to_bytes(4, "big"))


class ReplayServer(ThreadedServer):
    """Serves the `Exchange` that `handler` returns for each request, over HTTP/1.1.

    `reverse` (e.g. ``"https://api.openai.com"``) turns on base-URL mode: origin-form requests
    on the plain listener mean ``reverse + path``. Absolute-form requests and ``CONNECT``
    tunnels are served in either mode. `pace` None answers at once; 1.0 reproduces the
    recorded timing, 0.5 halves it, 2.0 doubles it.
    """

    thread_name = "wiretape-replay"
    stop_timeout = STOP_TIMEOUT

    def __init__(
        self,
        handler: Handler,
        *,
        home: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        reverse: str | None = None,
        pace: float | None = None,
    ) -> None:
        if pace is not None and pace < 0:
            raise ValueError(f"pace must be None or a number >= 0, not {pace!r}")
        self.handler = handler
        self.home = home
        self.host = host
        self.port = port
        self.reverse = reverse
        self.pace = pace
        self.reverse_origin = None if reverse is None else reverse_origin(reverse)
        self._server: asyncio.Server | None = None
        self.connections: set[_Connection] = set()  # the open client connections
        self._issuer: LeafIssuer | None = None
        self.heads = _HeadCache()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the replay server is not running")
        return self.host, self.port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the replay server is already running")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop), self.host, self.port, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.abort()
        await asyncio.sleep(0)  # let the aborted transports run connection_lost
        with suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), STOP_TIMEOUT)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def tls_context(self, host: str) -> ssl.SSLContext:
        """The server context for a tunnel to `host`; certificate work starts on first use."""
        return self._leaf_issuer().context_for(host)

    def prepare_tls(self) -> None:
        """Do the certificate work the first tunnel would otherwise wait for. Thread-safe."""
        self._leaf_issuer().prepare()

    def _leaf_issuer(self) -> LeafIssuer:
        if self._issuer is None:
            from .certificates import LeafIssuer

            self._issuer = LeafIssuer(self.home)
        return self._issuer


def reverse_origin(reverse: str) -> str:
    """The logical origin (and path prefix) that base-URL requests are appended to."""
    parts = urlsplit(reverse)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"reverse must look like https://api.example.com, not {reverse!r}")
    return origin(scheme, parts.hostname, parts.port) + parts.path.rstrip("/")


def origin(scheme: str, host: str, port: int | None) -> str:
    """``scheme://host[:port]``, host lowercased, the scheme's default port left out."""
    host = host.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


# -- one client connection ------------------------------------------------------------------


class _Reply:
    """A request waiting for its answer, in arrival order: pipelined answers go out in order."""

    __slots__ = ("bodiless", "exchange", "http11", "keep_alive", "raw", "received", "task")

    def __init__(self, received: float, keep_alive: bool, http11: bool, bodiless: bool) -> None:
        self.received = received  # loop time when the request was fully read
        self.keep_alive = keep_alive
        self.http11 = http11
        self.bodiless = bodiless  # a HEAD request: the answer has a head only
        self.task: asyncio.Task[Exchange] | None = None
        self.exchange: Exchange | None = None  # known without asking the handler
        self.raw: bytes | None = None  # not an HTTP answer: a CONNECT's "200 established"


class _HeldUpgrade:
    """A request asking to upgrade (h2c, websocket) whose body llhttp left unread."""

    __slots__ = ("headers", "http_version", "keep_alive", "method", "target")

    def __init__(
        self, method: str, target: bytes, http_version: str, headers: list, keep_alive: bool
    ) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive

    def framing(self) -> bytes:
        """A stand-in request head with the original framing, for reading the body that follows."""
        if any(name.lower() == "transfer-encoding" for name, _ in self.headers):
            return b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        for name, value in self.headers:
            if name.lower() == "content-length":
                return b"POST / HTTP/1.1\r\nContent-Length: %s\r\n\r\n" % value.encode("latin-1")
        return b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"


class _Connection(asyncio.Protocol):
    """One client connection: plain, then maybe a CONNECT tunnel, plain or TLS inside."""

    def __init__(self, server: ReplayServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.pace = server.pace
        self.heads = server.heads
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.out: asyncio.Transport | _TLSSession = None  # type: ignore[assignment]
        self.tls: _TLSSession | None = None
        self.parser = httptools.HttpRequestParser(self)
        # What origin-form targets are relative to: the reverse origin, or the tunnel's.
        self.origin = server.reverse_origin
        self.tunnel: tuple[str, int] | None = None  # CONNECT target, before its first byte
        self.held: _HeldUpgrade | None = None
        self.queue: collections.deque[_Reply] = collections.deque()
        self.responder: asyncio.Task[None] | None = None
        self.closing = False  # no request after the current ones will be answered
        self.peer_done = False  # the client sent EOF: answer what was asked, then close
        self.writes_paused = False
        self._target = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.out = transport  # type: ignore[assignment]
        if not self.server.serving:
            transport.abort()  # type: ignore[attr-defined]
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.responder is not None:
            self.responder.cancel()
        for reply in self.queue:
            if reply.task is not None:
                reply.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.tls is not None:
            data = self._decrypt(data)
        elif self.tunnel is not None:
            data = self._enter_tunnel(data)
        if data and not self.closing:
            self._parse(data)
        if self.tls is not None and self.tls.peer_closed and not self.eof_received():
            self._close()  # the client's close_notify, with nothing left to answer

    def eof_received(self) -> bool:
        self.peer_done = True
        # Keep the writing half open while answers to what was asked are still due.
        return self.responder is not None

    def pause_writing(self) -> None:
        self.writes_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writes_paused = False
        self._update_reading()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._target = b""
        self._headers = []
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))
        if len(name) == 6 and name.lower() == b"expect":
            self._continue(value)

    def _continue(self, expectation: bytes) -> None:
        # curl waits a second for a "100 Continue" before it sends a body of over 1 KB.
        # Not while earlier answers are due: it would overtake them.
        if expectation.lower() == b"100-continue" and not self.queue:
            self.out.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.closing:
            return
        parser = self.parser
        held, self.held = self.held, None
        if held is not None:  # the body of an upgrade request we ignored
            self._dispatch(
                held.method, held.target, held.http_version, held.headers, held.keep_alive
            )
            return
        method = parser.get_method().decode("latin-1")
        version = parser.get_http_version()
        if method == "CONNECT":
            self._open_tunnel(self._target.decode("latin-1"))
        elif parser.should_upgrade():
            self.held = _HeldUpgrade(
                method, self._target, version, self._headers, parser.should_keep_alive()
            )
        else:
            self._dispatch(method, self._target, version, self._headers, parser.should_keep_alive())

    # reading

    def _parse(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._after_upgrade(data[upgrade.args[0] :])
        except httptools.HttpParserCallbackError as exc:  # a bug of ours, not the client's
            _log.error("replay failed on a request", exc_info=exc.__context__)
            self._reject(500, f"wiretape replay failed: {exc.__context__!r}", keep_alive=False)
        except httptools.HttpParserError as exc:
            if data.startswith(H2_PREFACE):
                self.out.write(H2_USE_HTTP11)
                self._close()
            else:
                self._reject(400, f"malformed HTTP/1.1 request: {exc}", keep_alive=False)

    def _after_upgrade(self, rest: bytes) -> None:
        # llhttp stops at a CONNECT or an Upgrade request; reading goes on with a new parser.
        self.parser = httptools.HttpRequestParser(self)
        if self.closing:
            return
        if self.held is not None:
            # Answered in HTTP/1.1, as a server that does not do the upgrade does; llhttp
            # skipped the body, so read it under a stand-in head with the same framing.
            self._parse(self.held.framing() + rest)
        elif rest:
            self.data_received(rest)

    def _open_tunnel(self, authority: str) -> None:
        host, _, port = authority.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            self._reject(400, f"CONNECT needs a host:port target, not {authority!r}", False)
            return
        if self.tls is not None:
            self._reject(400, "wiretape does not nest a TLS tunnel in another", False)
            return
        self.tunnel = (host.lower(), int(port))
        self.origin = None
        self._enqueue_raw(b"HTTP/1.1 200 Connection established\r\n\r\n")

    def _enter_tunnel(self, data: bytes) -> bytes:
        """Decide from the tunnel's first byte whether the client speaks TLS or plain HTTP."""
        assert self.tunnel is not None
        host, port = self.tunnel
        self.tunnel = None
        if data[0] != TLS_HANDSHAKE:
            # undici tunnels with CONNECT even to http:// targets.
            self.origin = origin("http", host, port)
            return data
        self.origin = origin("https", host, port)
        try:
            context = self.server.tls_context(host)
        except Exception:
            _log.exception("replay cannot issue a TLS certificate for %s", host)
            self.abort()
            return b""
        self.tls = self.out = _TLSSession(context, self.transport)
        return self._decrypt(data)

    def _decrypt(self, data: bytes) -> bytes:
        assert self.tls is not None
        try:
            return self.tls.receive(data)
        except ssl.SSLError:  # a failed handshake, e.g. the client does not trust the CA
            self.transport.close()
            return b""

    # answering

    def _dispatch(
        self, method: str, target: bytes, version: str, headers: list, keep_alive: bool
    ) -> None:
        reply = _Reply(self.loop.time(), keep_alive, version == "1.1", method == "HEAD")
        if not keep_alive:
            self.closing = True
        url = self._logical_url(target)
        if url is None:
            reply.exchange = _local_exchange(400, self._unroutable(target))
            self._enqueue(reply)
            return
        body = b"".join(self._body)
        request = Request(method, url, "HTTP/" + version, headers, body)
        try:
            answer = self.server.handler(request)
            if not asyncio.iscoroutine(answer):
                answer = _awaited(answer)
            task = asyncio.Task(answer, loop=self.loop, eager_start=True)
        except Exception as exc:
            reply.exchange = _handler_failure(exc)
            self._enqueue(reply)
            return
        if task.done() and not self.queue and self.pace is None and not task.cancelled():
            # The fast path: the handler answered without waiting, nothing is ahead in line.
            failure = task.exception()
            exchange = _handler_failure(failure) if failure else task.result()
            if type(exchange) is Exchange and exchange.error is None and exchange.response:
                self._send_whole(reply, exchange.response)
                if not reply.keep_alive:  # asked by the client, or an HTTP/1.0 stream's end
                    self._close()
                return
        reply.task = task
        self._enqueue(reply)

    def _logical_url(self, target: bytes) -> str | None:
        if target[:1] == b"/":
            return None if self.origin is None else self.origin + target.decode("latin-1")
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return None
        scheme = (url.schema or b"").decode("latin-1").lower()
        if scheme not in DEFAULT_PORTS or not url.host:
            return None
        query = b"" if url.query is None else b"?" + url.query
        path = (url.path or b"/") + query
        return origin(scheme, url.host.decode("latin-1"), url.port) + path.decode("latin-1")

    def _unroutable(self, target: bytes) -> str:
        shown = target.decode("latin-1")[:200]
        if target[:1] == b"/":
            return (
                f"wiretape cannot tell which upstream {shown!r} is for: send requests through "
                "it as a proxy (HTTPS_PROXY), or start replay with a reverse base URL"
            )
        return f"wiretape serves http(s) URLs and origin-form paths, not {shown!r}"

    def _reject(self, status: int, message: str, keep_alive: bool) -> None:
        reply = _Reply(self.loop.time(), keep_alive, True, False)
        reply.exchange = _local_exchange(status, message)
        if not keep_alive:
            self.closing = True
        self._enqueue(reply)

    def _enqueue_raw(self, data: bytes) -> None:
        if self.queue:
            reply = _Reply(self.loop.time(), True, True, False)
            reply.raw = data
            self._enqueue(reply)
        else:
            self.out.write(data)

    def _enqueue(self, reply: _Reply) -> None:
        self.queue.append(reply)
        if self.responder is None:
            self.responder = self.loop.create_task(self._respond())
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport.is_closing():
            return
        if self.writes_paused or len(self.queue) > MAX_PIPELINED:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    async def _respond(self) -> None:
        """Answers queued requests one after another, in the order they arrived."""
        try:
            while self.queue:
                reply = self.queue[0]
                if not await self._answer(reply):
                    self._close()  # a no-op when the answer already closed or reset it
                    return
                self.queue.popleft()
                self._update_reading()
            if self.closing or self.peer_done:
                self._close()
        finally:
            self.responder = None

    async def _answer(self, reply: _Reply) -> bool:
        """Sends one answer; False when the connection is over (closed or reset)."""
        if reply.raw is not None:
            self.out.write(reply.raw)
            return True
        exchange = reply.exchange
        if exchange is None:
            assert reply.task is not None
            try:
                exchange = await reply.task
            except asyncio.CancelledError as exc:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the connection is going away
                exchange = _handler_failure(exc)  # the handler cancelled itself
            except Exception as exc:
                exchange = _handler_failure(exc)
        if not isinstance(exchange, Exchange):
            exchange = _handler_failure(TypeError(f"the handler returned {exchange!r:.80}"))
        elif exchange.response is None and exchange.error is None:
            exchange = _handler_failure(ValueError("an exchange with no response and no error"))
        response, error = exchange.response, exchange.error
        if response is None:
            await self._fail_without_response(reply, exchange)
            return False
        if error is None and self.pace is None:
            self._send_whole(reply, response)
        else:
            await self._send_paced(reply, exchange)
            if error is not None:
                await self._cut(reply, exchange)
                return False
        return reply.keep_alive

    def _send_whole(self, reply: _Reply, response: Response) -> None:
        # One write per answer: on Python 3.12.1 writelines() skips flow control.
        framing = _framing(reply, response, streamed=response.chunks is not None)
        head = self.heads.recorded(response, framing)
        if framing == NO_BODY:
            self.out.write(head + _head_end(reply, framing))
        elif response.chunks is None:
            self.out.write(b"".join((head, _head_end(reply, framing), response.body or b"")))
        elif framing == CHUNKED:
            parts = [head, _head_end(reply, framing)]
            parts.extend(_chunk_frame(chunk.data) for chunk in response.chunks if chunk.data)
            parts.append(_last_chunk(response))
            self.out.write(b"".join(parts))
        else:
            parts = [head, _head_end(reply, framing)]
            parts.extend(chunk.data for chunk in response.chunks)
            self.out.write(b"".join(parts))

    async def _send_paced(self, reply: _Reply, exchange: Exchange) -> None:
        """The head at `headers_us`, each chunk at its `at_us`, a whole body at `done_us`."""
        response = exchange.response
        assert response is not None
        timings, cut = exchange.timings, exchange.error is not None
        # A cut body is sent chunked (raw for HTTP/1.0) so that the client sees it end early.
        framing = _framing(reply, response, streamed=response.chunks is not None or cut)
        await self._until(reply, timings.headers_us)
        self.out.write(self.heads.recorded(response, framing) + _head_end(reply, framing))
        if framing == NO_BODY:
            return
        if response.chunks is not None:
            pieces = [(chunk.at_us, chunk.data) for chunk in response.chunks if chunk.data]
        else:
            pieces = [(timings.done_us, response.body)] if response.body else []
        for at_us, data in pieces:
            await self._until(reply, at_us)
            self.out.write(_chunk_frame(data) if framing == CHUNKED else data)
        if not cut:
            await self._until(reply, timings.done_us)
            if framing == CHUNKED:
                self.out.write(_last_chunk(response))

    async def _fail_without_response(self, reply: _Reply, exchange: Exchange) -> None:
        # The upstream never answered (refused, dns, tls, timeout, ...): neither does replay.
        error = exchange.error
        if error is not None and error.kind == "timeout":
            await self._until(reply, exchange.timings.done_us)
        if error is not None and error.kind in RESET_KINDS:
            self._reset()
        else:
            self._close()

    async def _cut(self, reply: _Reply, exchange: Exchange) -> None:
        """Ends a partial answer the way the recorded one ended: a reset, or a bare close."""
        await self._until(reply, exchange.timings.done_us)
        await self._flushed()
        assert exchange.error is not None
        if exchange.error.kind in RESET_KINDS:
            self._reset()
        else:
            self._close()

    async def _until(self, reply: _Reply, at_us: int | None) -> None:
        """Waits until `at_us` (scaled by pace) after the request arrived; no wait unpaced."""
        if at_us is None or not self.pace:
            return
        delay = reply.received + at_us * self.pace / 1e6 - self.loop.time() - TIMER_LEAD
        if delay > 0:
            await asyncio.sleep(delay)

    async def _flushed(self) -> None:
        # A reset drops whatever is still buffered, in asyncio and in the kernel: let the
        # partial body reach the client first, as it did when it was recorded.
        deadline = self.loop.time() + RESET_FLUSH_TIMEOUT
        while self.loop.time() < deadline and not self.transport.is_closing():
            if not self.transport.get_write_buffer_size() and not self._unsent_in_kernel():
                return
            await asyncio.sleep(0.001)

    def _unsent_in_kernel(self) -> int:
        sock = self.transport.get_extra_info("socket")
        if sock is None or sys.platform != "linux":
            return 0
        import fcntl

        try:
            queued = fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return 0
        return struct.unpack("i", queued)[0]

    # closing

    def _close(self) -> None:
        self.closing = True
        if self.tls is not None:
            self.tls.close()
        self.transport.close()

    def _reset(self) -> None:
        """Aborts with a TCP reset (SO_LINGER 0), as a cut upstream connection looks."""
        self.closing = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.transport.abort()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


class _TLSSession:
    """TLS over the connection's transport through memory BIOs.

    Not `loop.start_tls()`: the ClientHello has already been read (that is how a TLS tunnel
    is told from a plain one), and memory BIOs take it as it is.
    """

    __slots__ = ("incoming", "outgoing", "peer_closed", "tls", "transport")

    def __init__(self, context: ssl.SSLContext, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.peer_closed = False  # the client sent close_notify

    def receive(self, data: bytes) -> bytes:
        """The plaintext that `data` completes (often b""); raises ssl.SSLError on failure."""
        self.incoming.write(data)
        pieces = []
        try:
            # read() drives the handshake first, until it needs more from the client.
            while piece := self.tls.read(65536):
                pieces.append(piece)
            self.peer_closed = True  # read() gives b"" only after close_notify
        except ssl.SSLWantReadError:
            pass
        finally:
            self._flush()  # handshake messages, session tickets, alerts
        return b"".join(pieces)

    def write(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self.tls.write(data)
        self._flush()

    def close(self) -> None:
        with suppress(ssl.SSLError):
            self.tls.unwrap()  # queues our close_notify; the client's is not awaited
        self._flush()

    def _flush(self) -> None:
        if self.outgoing.pending and not self.transport.is_closing():
            self.transport.write(self.outgoing.read())


# -- building answers -----------------------------------------------------------------------


def _framing(reply: _Reply, response: Response, streamed: bool) -> int:
    """How this answer's body is delimited: a Content-Length, or one of the constants."""
    if reply.bodiless or response.status in (204, 304) or response.status < 200:
        return NO_BODY
    if not streamed:
        return len(response.body or b"")
    if reply.http11:
        return CHUNKED
    reply.keep_alive = False  # the close is what ends the body
    return UNTIL_CLOSE


class _HeadCache:
    """The status line and recorded headers of each response served, built once per response.

    Replay serves the same few responses over and over, and building a head is most of the
    Python work per request. Keyed by identity, each entry holding its response so that the
    id cannot be reused while cached: a response must not be changed once it has been served.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._heads: dict[int, tuple[Response, bytes]] = {}

    def recorded(self, response: Response, framing: int) -> bytes:
        key = id(response) << 1 | (framing == NO_BODY)
        entry = self._heads.get(key)
        if entry is not None and entry[0] is response:
            return entry[1]
        if len(self._heads) >= self.size:
            self._heads.clear()
        head = _recorded_head(response, keep_length=framing == NO_BODY)
        self._heads[key] = (response, head)
        return head


def _recorded_head(response: Response, keep_length: bool) -> bytes:
    """The status line and the recorded headers less hop-by-hop ones (and Content-Length,
    unless the answer has no body: a HEAD's tells the size of the GET's)."""
    status = response.status
    dropped = HOP_BY_HOP if keep_length else DROPPED_HEADERS
    lines = [f"HTTP/1.1 {status} {response.reason or _REASONS.get(status, '')}\r\n"]
    lines.extend(
        f"{name}: {value}\r\n" for name, value in response.headers if name.lower() not in dropped
    )
    return "".join(lines).encode("latin-1")


def _head_end(reply: _Reply, framing: int) -> bytes:
    """The rest of the head after the recorded headers: this answer's framing and connection."""
    if framing >= 0:
        line = b"Content-Length: %d\r\n" % framing
    elif framing == CHUNKED:
        line = b"Transfer-Encoding: chunked\r\n"
    else:
        line = b""
    if not reply.keep_alive:
        return line + b"Connection: close\r\n\r\n"
    if not reply.http11:
        return line + b"Connection: keep-alive\r\n\r\n"
    return line + b"\r\n"


def _chunk_frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _last_chunk(response: Response) -> bytes:
    trailers = response.trailers or ()
    fields = "".join(f"{name}: {value}\r\n" for name, value in trailers)
    return b"0\r\n" + fields.encode("latin-1") + b"\r\n"


def _local_exchange(status: int, message: str, kind: str = "wiretape_error") -> Exchange:
    """An answer made up by the server itself, which SDKs neither retry nor misread."""
    body = orjson.dumps({"error": {"type": kind, "message": message}})
    headers = [("content-type", "application/json"), ("x-should-retry", "false")]
    response = Response(status, _REASONS.get(status, ""), "HTTP/1.1", headers, body=body)
    request = Request("", "", "HTTP/1.1", [], b"")
    return Exchange(seq=0, offset_us=0, request=request, response=response, source="injected")


def _handler_failure(exc: BaseException) -> Exchange:
    return _local_exchange(500, f"wiretape replay failed: {type(exc).__name__}: {exc}")


async def _awaited(awaitable: Awaitable[Exchange]) -> Exchange:
    return await awaitable
