"""The replay server's network layer, proved with real clients over real loopback sockets.

A stub stands in for matching: it answers by path with hand-built exchanges and remembers
every request, so each test can assert the logical URL the server worked out. Nothing here
touches the internet: api.openai.com is only ever a CONNECT target the server terminates.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import requests
from wiretape.home import ca_bundle_path
from wiretape.replay_server import ReplayServer
from wiretape.tapes import Chunk, Exchange, Request, Response, Timings, UpstreamError

IO_TIMEOUT = 10.0
STOP_WITHIN = 1.5  # seconds; a slower stop means a connection or a task was left behind
JSON = [("content-type", "application/json")]
SSE = [("content-type", "text/event-stream; charset=utf-8")]
LOOPBACK = {"127.0.0.1", "::1", "localhost"}

Answer = Exchange | Callable[[Request], Awaitable[Exchange]]


def exchange(
    body: bytes | None = b'{"ok":true}',
    *,
    status: int = 200,
    reason: str = "OK",
    headers: list[tuple[str, str]] | None = None,
    chunks: list[bytes | tuple[int, bytes]] | None = None,
    trailers: list[tuple[str, str]] | None = None,
    error: str | None = None,
    headers_us: int | None = None,
    done_us: int | None = None,
) -> Exchange:
    """A recorded exchange; `chunks` items are data, or (at_us, data) for paced tests."""
    recorded = None
    if chunks is not None:
        recorded = [Chunk(*c) if isinstance(c, tuple) else Chunk(0, c) for c in chunks]
        body = None
    response = Response(
        status,
        reason,
        "HTTP/1.1",
        JSON if headers is None else headers,
        body=body,
        chunks=recorded,
        trailers=trailers,
    )
    return Exchange(
        seq=1,
        offset_us=0,
        request=Request("GET", "https://api.openai.com/", "HTTP/1.1", [], b""),
        response=None if error in ("refused", "timeout") else response,
        error=None
        if error is None
        else UpstreamError(error, f"recorded {error}", len(chunks or [])),
        timings=Timings(headers_us=headers_us, done_us=done_us),
    )


class StubReplayer:
    """Stands in for matching: answers by path (default: a small JSON body), remembers requests."""

    def __init__(self, answers: dict[str, Answer] | None = None) -> None:
        self.answers = answers or {}
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Exchange:
        self.requests.append(request)
        answer = self.answers.get(urlsplit(request.url).path, exchange())
        if callable(answer):
            return await answer(request)
        return answer

    @property
    def urls(self) -> list[str]:
        return [request.url for request in self.requests]


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients honour proxy variables, and no name but loopback may resolve in this process."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    resolve = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host not in LOOPBACK:
            raise AssertionError(f"something tried to resolve {host!r}")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("wiretape-home")
    ca_bundle_path(home)  # creating the CA costs a quarter second: once per session
    return home


@pytest.fixture
def home(session_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WIRETAPE_HOME", str(session_home))
    return session_home


@pytest.fixture
def bundle(home: Path) -> Path:
    return ca_bundle_path(home)


@pytest.fixture
def trusting(bundle: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(bundle))


@contextmanager
def serving(replayer: StubReplayer, home: Path, **options: object) -> Iterator[ReplayServer]:
    """A server on port 0 in a thread of its own; its stop must be quick whatever happened."""
    server = ReplayServer(replayer, home=home, **options)  # type: ignore[arg-type]
    server.start_in_thread()
    try:
        yield server
    finally:
        started = time.perf_counter()
        server.stop_thread()
        assert time.perf_counter() - started < STOP_WITHIN


def connect(server: ReplayServer) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=IO_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class RawResponse:
    """A response read off a socket by hand, keeping what clients hide: framing and chunks."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        status_line = stream.readline()
        assert status_line, "the server closed the connection without a response"
        self.status_line = status_line.decode("latin-1").rstrip("\r\n")
        self.status = int(self.status_line.split()[1])
        self.headers: list[tuple[str, str]] = []
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").rstrip("\r\n").partition(":")
            self.headers.append((name, value.strip()))
        self.chunk_sizes: list[int] = []
        self.chunk_times: list[float] = []
        self.trailers: list[tuple[str, str]] = []
        self.body = b""

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    def read_body(self, stream, head_request: bool = False) -> RawResponse:  # type: ignore[no-untyped-def]
        if head_request or self.status in (204, 304) or self.status < 200:
            return self
        if self.header("transfer-encoding") == "chunked":
            while size := int(stream.readline().split(b";")[0], 16):
                self.body += stream.read(size)
                self.chunk_times.append(time.perf_counter())
                self.chunk_sizes.append(size)
                assert stream.read(2) == b"\r\n"
            while (line := stream.readline()) != b"\r\n":
                name, _, value = line.decode("latin-1").rstrip("\r\n").partition(":")
                self.trailers.append((name, value.strip()))
        elif (length := self.header("content-length")) is not None:
            self.body = stream.read(int(length))
        else:
            self.body = stream.read()  # delimited by the close
        return self


def read_response(stream, head_request: bool = False) -> RawResponse:  # type: ignore[no-untyped-def]
    return RawResponse(stream).read_body(stream, head_request)


def get(path: str, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: replay.test", *extra, "", ""]
    return "\r\n".join(lines).encode()


# -- modes and logical URLs -----------------------------------------------------------------


def test_base_url_mode_serves_httpx_and_requests_at_the_reverse_origin(home: Path) -> None:
    replayer = StubReplayer({"/v1/models": exchange(b'{"data":[]}')})
    with serving(replayer, home, reverse="https://api.openai.com") as server:
        with httpx.Client(base_url=server.url, timeout=IO_TIMEOUT) as client:
            answer = client.post("/v1/chat/completions?trace=1", json={"model": "gpt-4o-mini"})
        listed = requests.get(f"{server.url}/v1/models", timeout=IO_TIMEOUT)
        authority = server.url.removeprefix("http://")
    assert answer.status_code == 200 and answer.content == b'{"ok":true}'
    assert answer.headers["content-type"] == "application/json"
    assert listed.status_code == 200 and listed.json() == {"data": []}
    assert replayer.urls == [
        "https://api.openai.com/v1/chat/completions?trace=1",
        "https://api.openai.com/v1/models",
    ]
    posted = replayer.requests[0]
    assert posted.method == "POST" and posted.http_version == "HTTP/1.1"
    assert posted.body == b'{"model":"gpt-4o-mini"}'
    assert posted.headers[0] == ("Host", authority)  # as sent
    assert posted.headers[-1] == ("Content-Type", "application/json")


def test_reverse_base_url_keeps_its_port_and_path_prefix(home: Path) -> None:
    replayer = StubReplayer()
    with serving(replayer, home, reverse="HTTP://Models.Example:8080/api/") as server:
        assert httpx.get(f"{server.url}/v1/x", timeout=IO_TIMEOUT).status_code == 200
    assert replayer.urls == ["http://models.example:8080/api/v1/x"]


@pytest.mark.parametrize(
    ("target", "logical"),
    [
        ("https://api.openai.com/v1/models", "https://api.openai.com/v1/models"),
        ("https://API.openai.com:8443/v1/models?x=1", "https://api.openai.com:8443/v1/models?x=1"),
        ("https://10.20.30.40/v1/models", "https://10.20.30.40/v1/models"),
    ],
)
def test_proxy_mode_terminates_tls_for_the_connect_host(
    home: Path, trusting: ssl.SSLContext, target: str, logical: str
) -> None:
    replayer = StubReplayer()
    with (
        serving(replayer, home) as server,
        httpx.Client(proxy=server.url, verify=trusting, timeout=IO_TIMEOUT) as client,
    ):
        answers = [client.get(target) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(a.http_version == "HTTP/1.1" for a in answers)
    assert replayer.urls == [logical] * 3


def test_tls_offers_only_http11_over_alpn(home: Path, trusting: ssl.SSLContext) -> None:
    with serving(StubReplayer(), home) as server, connect(server) as raw:
        raw.sendall(b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n")
        assert raw.recv(1024) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        trusting.set_alpn_protocols(["h2", "http/1.1"])
        with trusting.wrap_socket(raw, server_hostname="api.openai.com") as tls:
            assert tls.selected_alpn_protocol() == "http/1.1"
            tls.sendall(get("/v1/models"))
            assert read_response(tls.makefile("rb")).body == b'{"ok":true}'


def test_a_clean_tls_close_from_the_client_closes_the_tunnel(
    home: Path, trusting: ssl.SSLContext
) -> None:
    with serving(StubReplayer(), home) as server, connect(server) as raw:
        raw.sendall(b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n")
        assert raw.recv(1024).startswith(b"HTTP/1.1 200 ")
        tls = trusting.wrap_socket(raw, server_hostname="api.openai.com")
        tls.sendall(get("/v1/models"))
        assert read_response(tls.makefile("rb")).status == 200
        plain = tls.unwrap()  # our close_notify, answered by the server's
        assert plain.recv(1) == b""  # and then the server closed the connection


SSE_EVENTS = [
    {"role": "assistant", "content": ""},
    {"content": "Hello"},
    {"content": ", world"},
]


def chat_stream() -> Exchange:
    def event(delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1735689600,
            "model": "gpt-4o-mini",
            "choices": [choice],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    events = [event(delta) for delta in SSE_EVENTS]
    events += [event({}, "stop"), b"data: [DONE]\n\n"]
    return exchange(chunks=events, headers=[*SSE, ("x-request-id", "req_1")])


def test_openai_sdk_streams_a_recorded_chat_completion_through_the_proxy(
    home: Path, trusting: ssl.SSLContext
) -> None:
    replayer = StubReplayer({"/v1/chat/completions": chat_stream()})
    with serving(replayer, home) as server:
        client = openai.OpenAI(
            base_url="https://api.openai.com/v1",
            api_key="sk-test-replay",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(proxy=server.url, verify=trusting),
        )
        with client:
            stream = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
            deltas = [chunk.choices[0].delta.content for chunk in stream]
    assert deltas == ["", "Hello", ", world", None]
    assert replayer.urls == ["https://api.openai.com/v1/chat/completions"]
    body = json.loads(replayer.requests[0].body)
    assert body["stream"] is True and body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "http2-offered"])
def test_curl_through_the_proxy(home: Path, bundle: Path, http2: bool) -> None:
    replayer = StubReplayer({"/v1/models": exchange(b'{"object":"list","data":[]}')})
    with serving(replayer, home) as server:
        command = ["curl", "-sS", "--max-time", "10", "--proxy", server.url]
        command += ["--cacert", str(bundle), "-D", "-", "https://api.openai.com/v1/models"]
        result = subprocess.run(
            [*command, "--http2"] if http2 else command,
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
        )
    assert result.returncode == 0, result.stderr
    assert "HTTP/1.1 200 OK" in result.stdout  # HTTP/2 offered, HTTP/1.1 negotiated
    assert result.stdout.endswith('{"object":"list","data":[]}')
    assert replayer.urls == ["https://api.openai.com/v1/models"]


def test_plain_http_inside_a_connect_tunnel(home: Path) -> None:
    replayer = StubReplayer()
    with serving(replayer, home) as server:
        for authority in ("Example.com:80", "example.com:8080"):
            with connect(server) as raw:
                raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
                stream = raw.makefile("rb")
                assert stream.readline() == b"HTTP/1.1 200 Connection established\r\n"
                assert stream.readline() == b"\r\n"
                raw.sendall(get("/v1/models?limit=2"))
                assert read_response(stream).status == 200
    assert replayer.urls == [
        "http://example.com/v1/models?limit=2",
        "http://example.com:8080/v1/models?limit=2",
    ]


def test_absolute_form_requests_are_proxied_plain(home: Path) -> None:
    replayer = StubReplayer()
    with (
        serving(replayer, home, reverse="https://api.openai.com") as server,
        httpx.Client(proxy=server.url, timeout=IO_TIMEOUT) as client,
    ):
        assert client.get("http://Internal.Example:80/tools/run?x=1").status_code == 200
        assert client.post("http://internal.example:9000/t", content=b"x").status_code == 200
    assert replayer.urls == [
        "http://internal.example/tools/run?x=1",
        "http://internal.example:9000/t",
    ]


def test_origin_form_without_reverse_is_told_how_to_connect(home: Path) -> None:
    replayer = StubReplayer()
    with serving(replayer, home) as server:
        answer = httpx.get(f"{server.url}/v1/models", timeout=IO_TIMEOUT)
    assert answer.status_code == 400
    assert answer.headers["x-should-retry"] == "false"
    error = answer.json()["error"]
    assert error["type"] == "wiretape_error" and "HTTPS_PROXY" in error["message"]
    assert replayer.requests == []


# -- what is sent back ----------------------------------------------------------------------


def test_recorded_chunk_boundaries_and_trailers_reach_the_client(home: Path) -> None:
    pieces = [b"data: a\n\n", b"d" * 1000, b"x", b"data: [DONE]\n\n"]
    recorded = exchange(chunks=pieces, headers=SSE, trailers=[("x-checksum", "abc")])
    with (
        serving(StubReplayer({"/stream": recorded}), home, reverse="http://up.test") as server,
        connect(server) as raw,
    ):
        raw.sendall(get("/stream"))
        answer = read_response(raw.makefile("rb"))
    assert answer.chunk_sizes == [len(piece) for piece in pieces]
    assert answer.body == b"".join(pieces)
    assert answer.trailers == [("x-checksum", "abc")]


def test_hop_by_hop_headers_are_dropped_and_framing_rewritten(home: Path) -> None:
    recorded_headers = [
        ("Date", "Tue, 01 Jul 2025 10:00:00 GMT"),
        ("Connection", "keep-alive"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "999"),
        ("TE", "trailers"),
        ("Trailer", "x-checksum"),
        ("Upgrade", "h2c"),
        ("Proxy-Authenticate", "Basic"),
        ("Proxy-Connection", "keep-alive"),
        ("Content-Type", "application/json"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
    ]
    recorded = exchange(b"{}", status=201, reason="", headers=recorded_headers)
    with (
        serving(StubReplayer({"/made": recorded}), home, reverse="http://up.test") as server,
        connect(server) as raw,
    ):
        raw.sendall(get("/made"))
        answer = read_response(raw.makefile("rb"))
    assert answer.status_line == "HTTP/1.1 201 Created"  # HTTP/2 recordings have no reason
    assert answer.headers == [
        ("Date", "Tue, 01 Jul 2025 10:00:00 GMT"),
        ("Content-Type", "application/json"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
        ("Content-Length", "2"),
    ]
    assert answer.body == b"{}"


def test_head_204_and_304_answers_carry_no_body(home: Path) -> None:
    replayer = StubReplayer(
        {
            "/file": exchange(b"", headers=[("content-length", "1234")]),
            "/gone": exchange(b"", status=204, reason="No Content"),
            "/same": exchange(b"", status=304, reason="Not Modified"),
        }
    )
    with serving(replayer, home, reverse="http://up.test") as server, connect(server) as raw:
        stream = raw.makefile("rb")
        raw.sendall(get("/file").replace(b"GET", b"HEAD", 1) + get("/gone") + get("/same"))
        head = read_response(stream, head_request=True)
        assert head.header("content-length") == "1234"  # the GET's size, as recorded
        assert [read_response(stream).status for _ in range(2)] == [204, 304]
        raw.sendall(get("/after"))  # nothing stray was sent: the next answer parses
        assert read_response(stream).body == b'{"ok":true}'


@pytest.mark.parametrize("keep_alive", [False, True])
def test_an_http10_client_gets_a_stream_delimited_by_the_close(
    home: Path, keep_alive: bool
) -> None:
    recorded = exchange(chunks=[b"data: 1\n\n", b"data: 2\n\n"], headers=SSE)
    asked = ["Connection: keep-alive"] if keep_alive else []
    with (
        serving(StubReplayer({"/s": recorded}), home, reverse="http://up.test") as server,
        connect(server) as raw,
    ):
        raw.sendall(get("/s", *asked, version="1.0"))
        answer = read_response(raw.makefile("rb"))
    assert answer.header("transfer-encoding") is None
    assert answer.header("connection") == "close"
    assert answer.body == b"data: 1\n\ndata: 2\n\n"


# -- connections ----------------------------------------------------------------------------


def test_keep_alive_serves_many_requests_on_one_connection(home: Path) -> None:
    replayer = StubReplayer()
    with serving(replayer, home, reverse="http://up.test") as server, connect(server) as raw:
        stream = raw.makefile("rb")
        for index in range(5):
            raw.sendall(get(f"/n/{index}"))
            assert read_response(stream).header("connection") is None
        raw.sendall(get("/last", "Connection: close"))
        assert read_response(stream).header("connection") == "close"
        assert stream.read() == b""  # and the server closed it
    assert len(replayer.requests) == 6


def test_pipelined_requests_are_answered_in_order(home: Path) -> None:
    async def slow(request: Request) -> Exchange:
        await asyncio.sleep(0.05)
        return exchange(b"slow")

    answers: dict[str, Answer] = {"/slow": slow, "/a": exchange(b"a"), "/b": exchange(b"b")}
    answers["/stream"] = exchange(chunks=[b"s1", b"s2"])
    with (
        serving(StubReplayer(answers), home, reverse="http://up.test") as server,
        connect(server) as raw,
    ):
        raw.sendall(get("/slow") + get("/a") + get("/stream") + get("/b", "Connection: close"))
        stream = raw.makefile("rb")
        bodies = [read_response(stream).body for _ in range(4)]
        assert stream.read() == b""
    assert bodies == [b"slow", b"a", b"s1s2", b"b"]


def test_64_concurrent_streams_through_tls_are_all_answered_right(
    home: Path, trusting: ssl.SSLContext
) -> None:
    async def numbered(request: Request) -> Exchange:
        number = request.url.rsplit("/", 1)[1]
        if int(number) % 2:
            await asyncio.sleep(0.001)  # half the answers come later than the request
        return exchange(chunks=[f"data: {number}.{k}\n\n".encode() for k in range(5)])

    replayer = StubReplayer()
    replayer.answers = {f"/v1/stream/{n}": numbered for n in range(64)}

    async def fetch_all(proxy: str) -> list[bytes]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(
            proxy=proxy, verify=trusting, limits=limits, timeout=IO_TIMEOUT
        ) as client:

            async def fetch(n: int) -> bytes:
                async with client.stream("GET", f"https://api.openai.com/v1/stream/{n}") as r:
                    return b"".join([piece async for piece in r.aiter_raw()])

            return await asyncio.gather(*(fetch(n) for n in range(64)))

    with serving(replayer, home) as server:
        bodies = asyncio.run(fetch_all(server.url))
    expected = [b"".join(f"data: {n}.{k}\n\n".encode() for k in range(5)) for n in range(64)]
    assert bodies == expected
    assert len(replayer.requests) == 64


def test_request_bodies_are_read_whole_whatever_their_framing(home: Path) -> None:
    replayer = StubReplayer()
    chunked = (
        b"POST /chunked HTTP/1.1\r\nHost: up.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    expecting = (
        b"POST /expect HTTP/1.1\r\nHost: up.test\r\nContent-Length: 4\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    with serving(replayer, home, reverse="http://up.test") as server, connect(server) as raw:
        stream = raw.makefile("rb")
        raw.sendall(chunked)
        assert read_response(stream).status == 200
        raw.sendall(expecting)
        assert read_response(stream).status == 100  # without waiting for the body
        raw.sendall(b"body")
        assert read_response(stream).status == 200
    assert [request.body for request in replayer.requests] == [b"hello world", b"body"]


def test_a_malformed_request_gets_400_and_the_connection_closes(home: Path) -> None:
    with serving(StubReplayer(), home, reverse="http://up.test") as server, connect(server) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n")
        stream = raw.makefile("rb")
        answer = read_response(stream)
        assert answer.status == 400
        assert answer.header("connection") == "close"
        assert stream.read() == b""


async def broken(request: Request) -> Exchange:
    raise RuntimeError("the tape ran out")


async def empty(request: Request) -> Exchange:
    return Exchange(1, 0, request, response=None, error=None)


async def confused(request: Request) -> Exchange:
    return {"status": 200}  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("failing", "said"),
    [
        (broken, "the tape ran out"),
        (empty, "no response and no error"),
        (confused, "the handler returned {'status': 200}"),
    ],
    ids=["raises", "returns-nothing-to-send", "returns-no-exchange"],
)
def test_a_failing_handler_gets_500_json_and_the_server_goes_on(
    home: Path, failing: Answer, said: str
) -> None:
    replayer = StubReplayer({"/boom": failing})
    with (
        serving(replayer, home, reverse="https://api.openai.com") as server,
        httpx.Client(base_url=server.url, timeout=IO_TIMEOUT) as client,
    ):
        failed = client.get("/boom")
        after = client.get("/fine")
    assert failed.status_code == 500
    assert failed.headers["x-should-retry"] == "false"
    error = failed.json()["error"]
    assert error["type"] == "wiretape_error" and said in error["message"]
    assert after.status_code == 200


def test_http2_prior_knowledge_is_told_to_use_http11(home: Path) -> None:
    h2 = pytest.importorskip("h2.connection")
    client = h2.H2Connection()
    client.initiate_connection()
    with serving(StubReplayer(), home, reverse="http://up.test") as server, connect(server) as raw:
        raw.sendall(client.data_to_send())
        events = client.receive_data(raw.makefile("rb").read())
    ended = [event for event in events if type(event).__name__ == "ConnectionTerminated"]
    assert [event.error_code for event in ended] == [0xD]  # HTTP_1_1_REQUIRED


def test_an_h2c_upgrade_is_answered_in_http11_with_the_body_read(home: Path) -> None:
    replayer = StubReplayer()
    upgrade = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: up.test\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 7\r\n\r\n"
        b'{"a":1}'
    )
    with serving(replayer, home, reverse="http://up.test") as server, connect(server) as raw:
        raw.sendall(upgrade + get("/next"))
        stream = raw.makefile("rb")
        assert [read_response(stream).status_line for _ in range(2)] == ["HTTP/1.1 200 OK"] * 2
    assert replayer.urls == ["http://up.test/v1/embeddings", "http://up.test/next"]
    assert replayer.requests[0].body == b'{"a":1}'


def test_stop_closes_connections_even_mid_answer(home: Path) -> None:
    slow = exchange(headers_us=30_000_000)  # the head is due in 30 s
    replayer = StubReplayer({"/slow": slow})
    server = ReplayServer(replayer, home=home, reverse="http://t", pace=1.0)
    server.start_in_thread()
    address = server.address
    with connect(server) as idle, connect(server) as busy:
        busy.sendall(get("/slow"))
        idle.sendall(get("/quick"))
        assert read_response(idle.makefile("rb")).status == 200
        # Once the slow request is read: a close with unread data would be a reset instead.
        deadline = time.monotonic() + IO_TIMEOUT
        while len(replayer.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        started = time.perf_counter()
        server.stop_thread()
        assert time.perf_counter() - started < STOP_WITHIN
        assert idle.recv(1) == b""
        assert busy.recv(1) == b""
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=1).close()


# -- pacing and recorded failures -----------------------------------------------------------


def paced_stream() -> Exchange:
    pieces = [(150_000, b"data: 1\n\n"), (350_000, b"data: 2\n\n"), (550_000, b"data: 3\n\n")]
    return exchange(chunks=pieces, headers=SSE, headers_us=100_000, done_us=560_000)


@pytest.mark.parametrize("pace", [1.0, 0.1, None])
def test_pacing_scales_the_recorded_gaps(home: Path, pace: float | None) -> None:
    replayer = StubReplayer({"/s": paced_stream()})
    with (
        serving(replayer, home, reverse="http://up.test", pace=pace) as server,
        connect(server) as raw,
    ):
        started = time.perf_counter()
        raw.sendall(get("/s"))
        stream = raw.makefile("rb")
        answer = RawResponse(stream)
        head_after = time.perf_counter() - started
        answer.read_body(stream)
    spread = answer.chunk_times[-1] - answer.chunk_times[0]
    # Loose bounds, by order of magnitude: this machine has two busy cores.
    if pace == 1.0:
        assert 0.07 <= head_after < 1.0 and 0.3 <= spread < 1.5
    elif pace == 0.1:
        assert head_after < 0.1 and 0.02 <= spread < 0.2
    else:
        assert head_after < 0.1 and spread < 0.05
    assert answer.chunk_sizes == [9, 9, 9]


@pytest.mark.parametrize("pace", [None, 1.0])
def test_a_recorded_reset_cuts_the_stream_with_a_tcp_reset(home: Path, pace: float | None) -> None:
    cut = exchange(chunks=[(1_000, b"data: 1\n\n"), (2_000, b"data: 2\n\n")], error="reset")
    with serving(StubReplayer({"/cut": cut}), home, reverse="http://up.test", pace=pace) as server:
        with connect(server) as raw:
            raw.sendall(get("/cut"))
            stream = raw.makefile("rb")
            answer = RawResponse(stream)
            assert answer.status == 200
            framed = b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n"
            assert stream.read(len(framed)) == framed
            with pytest.raises(ConnectionResetError):
                stream.read(1)  # no terminating chunk, no FIN: a reset

        received = bytearray()
        with (
            httpx.Client(base_url=server.url, timeout=IO_TIMEOUT) as client,
            pytest.raises(httpx.TransportError),
            client.stream("GET", "/cut") as response,
        ):
            for piece in response.iter_raw():
                received += piece
    assert received == b"data: 1\n\ndata: 2\n\n"


def test_a_stream_cut_otherwise_ends_with_a_bare_close(home: Path) -> None:
    cut = exchange(chunks=[b"data: 1\n\n"], error="other")
    with (
        serving(StubReplayer({"/cut": cut}), home, reverse="http://up.test") as server,
        connect(server) as raw,
    ):
        raw.sendall(get("/cut"))
        stream = raw.makefile("rb")
        assert RawResponse(stream).status == 200
        assert stream.read() == b"9\r\ndata: 1\n\n\r\n"  # no last chunk, then a FIN


def test_a_recorded_refusal_closes_without_an_answer(home: Path, trusting: ssl.SSLContext) -> None:
    refused = exchange(error="refused")
    replayer = StubReplayer({"/v1/models": refused})
    with serving(replayer, home, reverse="http://up.test") as server:
        with connect(server) as raw:
            raw.sendall(get("/v1/models"))
            assert raw.recv(1024) == b""
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/v1/models", timeout=IO_TIMEOUT)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.url}/v1/models", timeout=IO_TIMEOUT)
        client = openai.OpenAI(
            base_url="https://api.openai.com/v1",
            api_key="sk-test-replay",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(proxy=server.url, verify=trusting),
        )
        with client, pytest.raises(openai.APIConnectionError):
            client.models.list()


def test_a_recorded_timeout_waits_its_time_then_closes(home: Path) -> None:
    timed_out = exchange(error="timeout", done_us=200_000)
    replayer = StubReplayer({"/t": timed_out})
    with (
        serving(replayer, home, reverse="http://up.test", pace=1.0) as server,
        connect(server) as raw,
    ):
        started = time.perf_counter()
        raw.sendall(get("/t"))
        assert raw.recv(1024) == b""
        assert 0.15 <= time.perf_counter() - started < 2


# -- start-up -------------------------------------------------------------------------------


def test_the_server_starts_without_certificate_or_proxy_machinery(tmp_path: Path) -> None:
    script = """
import asyncio, sys, time
started = time.perf_counter()
from pathlib import Path
from wiretape.replay_server import ReplayServer

async def main():
    server = ReplayServer(None, home=Path(sys.argv[1]))
    await server.start()
    print(time.perf_counter() - started)
    await server.stop()

asyncio.run(main())
heavy = [name for name in ("cryptography", "mitmproxy", "h11") if name in sys.modules]
print(",".join(heavy) or "none")
"""
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    seconds, heavy = result.stdout.split()
    assert heavy == "none"
    assert float(seconds) < 1.0  # about 0.1 s here; the budget is 0.3 s from process start
