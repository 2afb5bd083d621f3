"""A keep-alive HTTP/1.1 load client on raw sockets: direct, through a proxy, or to a base URL.

One thread drives C connections with a selector (epoll), one request in flight on each, and
parses no more than it must: the status line, then Content-Length or the chunked terminator.
Connections are dialled (TCP, CONNECT, TLS handshake) and warmed up before a timed window,
so each window measures requests on open keep-alive connections only. The client's own CPU
per request is measured too, so a run can show the client was not what set the pace.
"""

from __future__ import annotations

import os
import selectors
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "Connection",
    "Stream",
    "Target",
    "Window",
    "client_context",
    "dial",
    "drive",
    "drive_sequence",
    "percentile",
    "process_cpu_seconds",
    "round_trip",
    "stolen_seconds",
    "stream_events",
]

# A response slower than this (beyond the window) means the thing measured has stalled.
STALL_SECONDS = 15.0
_READ_SIZE = 256 * 1024
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Target:
    """How a client reaches the fake upstream: `address` is what it dials.

    Direct and proxy mode speak TLS to the origin (through a `CONNECT` tunnel in proxy mode,
    with the proxy's CA in `tls`); base-URL mode speaks plain HTTP to the proxy, which speaks
    TLS upstream. `pid` is the process between client and upstream, whose CPU is counted.
    """

    name: str
    address: tuple[str, int]
    origin: tuple[str, int]
    tls: ssl.SSLContext | None
    via_proxy: bool = False
    pid: int | None = None

    @property
    def host(self) -> str:
        host, port = self.address if self.tls is None else self.origin
        return f"{host}:{port}"

    def request(
        self, method: str, path: str, body: bytes = b"", headers: tuple[str, ...] = ()
    ) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}", *headers]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"content-length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def client_context(cafile: str) -> ssl.SSLContext:
    """A TLS client context trusting `cafile` only, offering HTTP/1.1 (as an SDK would)."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context


def dial(target: Target, timeout: float = 10.0) -> Connection:
    """Open a connection: TCP, then `CONNECT` in proxy mode, then the TLS handshake."""
    sock = socket.create_connection(target.address, timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if target.via_proxy:
            host, port = target.origin
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nhost: {host}:{port}\r\n\r\n".encode())
            reply = b""
            while b"\r\n\r\n" not in reply:
                data = sock.recv(4096)
                if not data:
                    raise ConnectionError(f"{target.name}: proxy closed the CONNECT tunnel")
                reply += data
            if not reply.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                raise ConnectionError(f"{target.name}: CONNECT refused: {reply.splitlines()[0]!r}")
        if target.tls is not None:
            sock = target.tls.wrap_socket(sock, server_hostname=target.origin[0])
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return Connection(target.name, sock)


class Connection:
    """One keep-alive connection with at most one request in flight."""

    __slots__ = ("body_size", "buffer", "head_size", "name", "need", "sent", "sent_at", "sock")

    def __init__(self, name: str, sock: socket.socket) -> None:
        self.name = name
        self.sock = sock
        self.buffer = bytearray()
        self.need: int | None = None  # the whole response's size, once its head is read
        self.head_size = 0
        self.body_size = 0  # of the last response, chunk framing included
        self.sent = 0
        self.sent_at = 0.0

    def send(self, request: bytes) -> None:
        self.sent += 1
        self.sent_at = time.perf_counter()
        try:
            written = self.sock.send(request)
        except (ssl.SSLWantWriteError, BlockingIOError):
            written = 0
        if written < len(request):  # never seen with requests this small; be correct anyway
            self.sock.setblocking(True)
            self.sock.sendall(request[written:])
            self.sock.setblocking(False)

    def receive(self) -> bool:
        """Read what has arrived; True once the response in flight is complete."""
        while True:
            try:
                data = self.sock.recv(_READ_SIZE)
            except (ssl.SSLWantReadError, BlockingIOError):
                break
            if not data:
                raise ConnectionError(f"{self.name}: connection closed mid-response")
            self.buffer += data
        buffer = self.buffer
        if self.need is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = bytes(buffer[:end]).lower()
            self.head_size = end + 4
            if not head.startswith(b"http/1.1 200"):
                raise ConnectionError(f"{self.name}: {head.splitlines()[0]!r}")
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                self.need = end + 4 + int(head[at + 17 :].split(b"\r\n", 1)[0])
            elif b"\r\ntransfer-encoding: chunked" in head:
                self.need = -1
            else:
                raise ConnectionError(f"{self.name}: a response with no length: {head!r}")
        if self.need >= 0 and len(buffer) < self.need:
            return False
        if self.need < 0 and not buffer.endswith(b"\r\n0\r\n\r\n"):
            return False
        self.body_size = len(buffer) - self.head_size
        buffer.clear()
        self.need = None
        return True

    def close(self) -> None:
        self.sock.close()


@dataclass(slots=True)
class Window:
    """What one timed window measured."""

    requests: int
    seconds: float
    latencies: list[float]  # seconds, sorted
    client_cpu: float  # seconds of this process's CPU
    proxy_cpu: float | None  # seconds of the proxy process's CPU

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def drive(
    connections: list[Connection], request: bytes, seconds: float, pid: int | None = None
) -> Window:
    """Keep one request in flight on each connection until `seconds` have passed.

    Every request sent counts, so the window ends when the last one completes: its elapsed
    time, its CPU and its latencies all cover the same requests.
    """
    selector = selectors.DefaultSelector()
    latencies: list[float] = []
    cpu_before = process_cpu_seconds(pid) if pid else None
    client_before = time.process_time()
    started = time.perf_counter()
    stop_sending = started + seconds
    try:
        for connection in connections:
            selector.register(connection.sock, selectors.EVENT_READ, connection)
            connection.send(request)
        active = len(connections)
        while active:
            events = selector.select(timeout=1.0)
            if not events and time.perf_counter() > stop_sending + STALL_SECONDS:
                raise TimeoutError(f"{connections[0].name}: no response in {STALL_SECONDS} s")
            for key, _ in events:
                connection = key.data
                if not connection.receive():
                    continue
                now = time.perf_counter()
                latencies.append(now - connection.sent_at)
                if now < stop_sending:
                    connection.send(request)
                else:
                    selector.unregister(connection.sock)
                    active -= 1
    finally:
        selector.close()
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    proxy_cpu = None if cpu_before is None else process_cpu_seconds(pid) - cpu_before
    latencies.sort()
    return Window(len(latencies), elapsed, latencies, client_cpu, proxy_cpu)


def drive_sequence(connections: list[Connection], requests: Iterator[bytes]) -> int:
    """Send every request of `requests`, one in flight per connection, until it runs out;
    returns how many were answered. For walking a tape's requests, not for timing them."""
    selector = selectors.DefaultSelector()
    answered = 0
    try:
        active = 0
        for connection in connections:
            request = next(requests, None)
            if request is None:
                break
            selector.register(connection.sock, selectors.EVENT_READ, connection)
            connection.send(request)
            active += 1
        while active:
            events = selector.select(timeout=STALL_SECONDS)
            if not events:
                raise TimeoutError(f"{connections[0].name}: no response in {STALL_SECONDS} s")
            for key, _ in events:
                connection = key.data
                if not connection.receive():
                    continue
                answered += 1
                request = next(requests, None)
                if request is None:
                    selector.unregister(connection.sock)
                    active -= 1
                else:
                    connection.send(request)
    finally:
        selector.close()
    return answered


@dataclass(slots=True)
class Stream:
    """One SSE response: when its first body byte came, and when each event completed."""

    first_byte: float  # seconds after the request was sent
    events: list[float]  # seconds after the request was sent, one per event


def stream_events(connection: Connection, request: bytes) -> Stream:
    """Send `request` and read its chunked SSE response, timing each event's arrival."""
    sock = connection.sock
    sock.setblocking(True)
    sock.settimeout(STALL_SECONDS)
    try:
        return _read_stream(connection.name, sock, request)
    finally:
        sock.setblocking(False)


def _read_stream(name: str, sock: socket.socket, request: bytes) -> Stream:
    sent_at = time.perf_counter()
    sock.sendall(request)
    raw = bytearray()
    while b"\r\n\r\n" not in raw:
        raw += _recv(name, sock)
    end = raw.find(b"\r\n\r\n")
    head = bytes(raw[:end]).lower()
    if not head.startswith(b"http/1.1 200") or b"transfer-encoding: chunked" not in head:
        raise ConnectionError(f"{name}: not a chunked 200 response: {head!r}")
    del raw[: end + 4]
    first_byte: float | None = None
    events: list[float] = []
    text = b""  # decoded body not yet split into events
    arrived = time.perf_counter()
    while True:
        body, finished = _take_chunks(raw)
        if body:
            if first_byte is None:
                first_byte = arrived - sent_at
            text += body
            *complete, text = text.split(b"\n\n")
            events.extend(arrived - sent_at for _ in complete)
        if finished:
            break
        raw += _recv(name, sock)
        arrived = time.perf_counter()
    if first_byte is None:
        raise ConnectionError(f"{name}: an empty stream")
    return Stream(first_byte, events)


def _take_chunks(raw: bytearray) -> tuple[bytes, bool]:
    """Remove the complete chunks at the front of `raw`: their data, and whether the last
    (zero-size) chunk was among them."""
    taken = bytearray()
    while True:
        line_end = raw.find(b"\r\n")
        if line_end < 0:
            return bytes(taken), False
        size = int(bytes(raw[:line_end]).split(b";", 1)[0], 16)
        if size == 0:
            if raw.find(b"\r\n\r\n", line_end) < 0:
                return bytes(taken), False
            return bytes(taken), True
        if len(raw) < line_end + 2 + size + 2:
            return bytes(taken), False
        taken += raw[line_end + 2 : line_end + 2 + size]
        del raw[: line_end + 2 + size + 2]


def _recv(name: str, sock: socket.socket) -> bytes:
    data = sock.recv(_READ_SIZE)
    if not data:
        raise ConnectionError(f"{name}: connection closed mid-stream")
    return data


def percentile(ordered: list[float], fraction: float) -> float:
    """The value below which `fraction` of the sorted sample lies (nearest rank)."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU of process `pid` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    # Fields 14 and 15 of stat(5); the split starts at field 3, the state.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def stolen_seconds() -> float:
    """CPU time the hypervisor gave other guests instead of this machine, all CPUs together
    (the "steal" column of /proc/stat; 0 on bare metal)."""
    with open("/proc/stat", "rb") as file:
        fields = file.readline().split()
    return int(fields[8]) / _CLOCK_TICKS if len(fields) > 8 else 0.0


def round_trip(address: tuple[str, int], count: int = 2000, size: int = 300) -> float:
    """The median seconds for `size` bytes to go to an echo server and back, one at a time."""
    sock = socket.create_connection(address, timeout=STALL_SECONDS)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * size
        times = []
        for _ in range(count):
            started = time.perf_counter()
            sock.sendall(message)
            received = 0
            while received < size:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the echo server closed the connection")
                received += len(data)
            times.append(time.perf_counter() - started)
    finally:
        sock.close()
    times.sort()
    return times[len(times) // 2]
