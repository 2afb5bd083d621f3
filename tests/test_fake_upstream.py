"""The fake LLM upstream speaks the real wire formats: proved with the real SDKs and raw sockets."""

from __future__ import annotations

import asyncio
import json
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from wiretape.fake_upstream import FakeUpstream, fake_bytes

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
}


@pytest.fixture(autouse=True)
def _direct_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDKs honour proxy variables; these tests talk to the fake upstream directly.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("all_proxy", raising=False)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture
def tls_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(tls=True) as server:
        yield server


def trusting(server: FakeUpstream) -> ssl.SSLContext:
    assert server.ca_path is not None
    return ssl.create_default_context(cafile=server.ca_path)


def openai_client(server: FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="sk-test-openai",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=trusting(server)),
    )


def anthropic_client(server: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url,
        api_key="sk-ant-test",
        max_retries=0,
        http_client=anthropic.DefaultHttpxClient(verify=trusting(server)),
    )


def chat_tools() -> list[dict]:
    return [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA},
        },
        {"type": "function", "function": {"name": "unused", "parameters": {"type": "object"}}},
    ]


# OpenAI Chat Completions.


def test_openai_chat_answers_with_the_last_user_message_over_tls(
    tls_upstream: FakeUpstream,
) -> None:
    with openai_client(tls_upstream) as client:
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
        ]
        first = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        again = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        other = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "What is 3+3?"}]
        )

    assert first.object == "chat.completion"
    assert first.model == "gpt-4o-mini"
    assert first.choices[0].message.content == "You said: What is 2+2?"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage is not None
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert again.id == first.id
    assert other.id != first.id
    assert other.choices[0].message.content == "You said: What is 3+3?"
    assert tls_upstream.request_count == 3
    received = tls_upstream.requests[0]
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.header("Authorization") == "Bearer sk-test-openai"
    assert json.loads(received.body)["messages"] == messages


def test_openai_chat_stream_is_sse_with_usage_last(tls_upstream: FakeUpstream) -> None:
    with openai_client(tls_upstream) as client:
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "stream me please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)

    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(pieces) == "You said: stream me please"
    assert len(pieces) == 5
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(pieces)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_openai_chat_stream_raw_framing_ends_with_done(upstream: FakeUpstream) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with (
        httpx.Client() as client,
        client.stream("POST", f"{upstream.url}/v1/chat/completions", json=body) as response,
    ):
        chunks = list(response.iter_raw())

    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    assert all(chunk.startswith(b"data: ") and chunk.endswith(b"\n\n") for chunk in chunks)
    assert chunks[-1] == b"data: [DONE]\n\n"
    assert b'"usage"' not in b"".join(chunks)  # only with stream_options.include_usage


def test_openai_chat_calls_the_first_tool_then_reads_its_result(
    tls_upstream: FakeUpstream,
) -> None:
    question = {"role": "user", "content": "weather in Paris"}
    with openai_client(tls_upstream) as client:
        called = client.chat.completions.create(
            model="gpt-4o-mini", messages=[question], tools=chat_tools()
        )
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[question], tools=chat_tools(), stream=True
        )
        chunks = list(stream)
        call = called.choices[0].message.tool_calls[0]
        answered = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                question,
                called.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"},
            ],
            tools=chat_tools(),
        )

    assert called.choices[0].finish_reason == "tool_calls"
    assert called.choices[0].message.content is None
    assert call.type == "function"
    assert call.function.name == "get_weather"
    arguments = {"location": "weather in Paris", "days": 3, "unit": "celsius"}
    assert json.loads(call.function.arguments) == arguments
    streamed_parts = [
        delta.tool_calls[0].function.arguments
        for chunk in chunks
        if chunk.choices and (delta := chunk.choices[0].delta).tool_calls
    ]
    assert len(streamed_parts) > 2
    assert json.loads("".join(streamed_parts)) == arguments
    assert chunks[0].choices[0].delta.tool_calls[0].id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert answered.choices[0].message.content == "The tool returned: 18C and sunny"
    assert answered.choices[0].message.tool_calls is None


def test_openai_async_client_trusts_the_ca_from_ssl_cert_file(
    tls_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpx2 reads SSL_CERT_FILE when the client is built, and it replaces the default store.
    monkeypatch.setenv("SSL_CERT_FILE", tls_upstream.ca_path)

    async def ask() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=f"{tls_upstream.url}/v1", api_key="sk-async", max_retries=0
        ) as client:
            whole = await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "async hello"}]
            )
            stream = await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "async stream"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            return whole.choices[0].message.content or "", text

    assert asyncio.run(ask()) == ("You said: async hello", "You said: async stream")
    assert tls_upstream.request_count == 2


def test_an_untrusted_ca_is_refused_before_any_request(
    tls_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    client = openai.OpenAI(base_url=f"{tls_upstream.url}/v1", api_key="sk", max_retries=0)
    with client, pytest.raises(openai.APIConnectionError):
        client.models.list()
    assert tls_upstream.request_count == 0


def test_openai_models_list(tls_upstream: FakeUpstream) -> None:
    with openai_client(tls_upstream) as client:
        models = [model.id for model in client.models.list()]
    assert "gpt-4o-mini" in models
    assert "claude-sonnet-4-6" in models


# OpenAI Responses.


def test_responses_api_text_whole_and_streamed(tls_upstream: FakeUpstream) -> None:
    with openai_client(tls_upstream) as client:
        whole = client.responses.create(model="gpt-4.1", input="tell me a fact")
        with client.responses.stream(
            model="gpt-4.1",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "stream a fact"}]}],
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()

    assert whole.status == "completed"
    assert whole.output_text == "You said: tell me a fact"
    assert whole.id.startswith("resp_")
    assert whole.usage is not None and whole.usage.output_tokens == 6
    assert final.output_text == "You said: stream a fact"
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 5
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_responses_stream_is_typed_sse(upstream: FakeUpstream) -> None:
    body = {"model": "gpt-4.1", "input": "raw", "stream": True}
    response = httpx.post(f"{upstream.url}/v1/responses", json=body)
    events = response.text.split("\n\n")[:-1]
    assert len(events) == 8 + 3  # 3 text deltas: "You", " said:", " raw"
    for number, event in enumerate(events):
        name, data = event.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        assert payload["sequence_number"] == number


def test_responses_api_function_call_and_its_output(tls_upstream: FakeUpstream) -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]
    with openai_client(tls_upstream) as client:
        called = client.responses.create(model="gpt-4.1", input="rain in Oslo?", tools=tools)
        with client.responses.stream(model="gpt-4.1", input="rain in Oslo?", tools=tools) as s:
            kinds = [event.type for event in s]
            streamed = s.get_final_response()
        call = called.output[0]
        answered = client.responses.create(
            model="gpt-4.1",
            input=[
                {"role": "user", "content": "rain in Oslo?"},
                {"type": "function_call_output", "call_id": call.call_id, "output": "no rain"},
            ],
            tools=tools,
        )

    assert call.type == "function_call"
    assert call.name == "get_weather"
    expected = {"location": "rain in Oslo?", "days": 3, "unit": "celsius"}
    assert json.loads(call.arguments) == expected
    assert streamed.output[0].type == "function_call"
    assert json.loads(streamed.output[0].arguments) == expected
    assert kinds.count("response.function_call_arguments.delta") > 2
    assert answered.output_text == "The tool returned: no rain"


# Anthropic Messages.


def test_anthropic_messages_whole_and_streamed(tls_upstream: FakeUpstream) -> None:
    question = [{"role": "user", "content": [{"type": "text", "text": "hello claude"}]}]
    with anthropic_client(tls_upstream) as client:
        whole = client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=question)
        with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=100, messages=question
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        raw = client.messages.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=question, stream=True
        )
        kinds = [event.type for event in raw]

    assert whole.type == "message" and whole.role == "assistant"
    assert whole.content[0].type == "text"
    assert whole.content[0].text == "You said: hello claude"
    assert whole.stop_reason == "end_turn"
    assert text == "You said: hello claude"
    assert final.content[0].text == text
    assert final.usage.output_tokens == 4
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    received = tls_upstream.requests[0]
    assert received.path == "/v1/messages"
    # anthropic 2.x sends the key as a bearer token, not as x-api-key.
    assert received.header("authorization") == "Bearer sk-ant-test"
    assert received.header("anthropic-version") is not None


def test_anthropic_stream_has_named_events_and_a_ping(upstream: FakeUpstream) -> None:
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 10,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    text = httpx.post(f"{upstream.url}/v1/messages", json=body).text
    names = re.findall(r"^event: (\S+)$", text, flags=re.MULTILINE)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_anthropic_async_tool_use_then_tool_result(tls_upstream: FakeUpstream) -> None:
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER_SCHEMA}]
    question = {"role": "user", "content": "weather in Rome"}

    async def converse() -> tuple[anthropic.types.Message, ...]:
        async with anthropic.AsyncAnthropic(
            base_url=tls_upstream.url,
            api_key="sk-ant-async",
            max_retries=0,
            http_client=anthropic.DefaultAsyncHttpxClient(verify=trusting(tls_upstream)),
        ) as client:
            whole = await client.messages.create(
                model="claude-sonnet-4-6", max_tokens=100, messages=[question], tools=tools
            )
            async with client.messages.stream(
                model="claude-sonnet-4-6", max_tokens=100, messages=[question], tools=tools
            ) as stream:
                streamed = await stream.get_final_message()
            use = whole.content[0]
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "warm"}
            answered = await client.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=100,
                tools=tools,
                messages=[
                    question,
                    {"role": "assistant", "content": [use.model_dump()]},
                    {"role": "user", "content": [result]},
                ],
            )
            return whole, streamed, answered

    whole, streamed, answered = asyncio.run(converse())
    expected = {"location": "weather in Rome", "days": 3, "unit": "celsius"}
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use"
        assert message.content[0].type == "tool_use"
        assert message.content[0].name == "get_weather"
        assert message.content[0].input == expected
    assert whole.content[0].id.startswith("toolu_")
    assert answered.stop_reason == "end_turn"
    assert answered.content[0].text == "The tool returned: warm"


# The test controls, over plain httpx.


def test_sse_events_arrive_as_separate_chunks(upstream: FakeUpstream) -> None:
    with (
        httpx.Client() as client,
        client.stream("GET", f"{upstream.url}/fake/sse?events=5") as response,
    ):
        chunks = list(response.iter_raw())
    assert chunks == [b'id: %d\ndata: {"n":%d,"of":5}\n\n' % (n, n) for n in range(5)]


def test_sse_interval_spaces_the_events(upstream: FakeUpstream) -> None:
    arrivals = []
    with httpx.Client() as client:
        started = time.monotonic()
        with client.stream("GET", f"{upstream.url}/fake/sse?events=4&interval_ms=60") as response:
            for _ in response.iter_raw():
                arrivals.append(time.monotonic())
    # Measured from the request, since a client stall can bunch arrivals but not advance them.
    assert len(arrivals) == 4
    assert arrivals[-1] - started >= 3 * 0.06


def test_server_delay_paces_llm_streams_unless_overridden() -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "a b c d"}]}
    with FakeUpstream(delay_ms=40) as server, httpx.Client(base_url=server.url) as client:
        started = time.monotonic()
        paced = client.post("/v1/chat/completions", json=body)
        paced_time = time.monotonic() - started
        started = time.monotonic()
        client.post("/v1/chat/completions", json=body, headers={"x-fake-interval-ms": "0"})
        header_time = time.monotonic() - started
        started = time.monotonic()
        client.post("/v1/chat/completions?interval_ms=0", json=body)
        query_time = time.monotonic() - started
    events = paced.text.count("data: ")
    assert events == 9  # role, 6 pieces, finish, [DONE]
    assert paced_time >= (events - 1) * 0.04 * 0.9
    assert header_time < paced_time / 2
    assert query_time < paced_time / 2


def test_bytes_are_deterministic_and_not_utf8(upstream: FakeUpstream) -> None:
    with httpx.Client(base_url=upstream.url) as client:
        first = client.get("/fake/bytes?size=4096&seed=7")
        second = client.get("/fake/bytes?size=4096&seed=7")
        other = client.get("/fake/bytes?size=4096&seed=8")
    assert first.headers["content-type"] == "application/octet-stream"
    assert len(first.content) == 4096
    assert first.content == second.content == fake_bytes(4096, 7)
    assert other.content != first.content
    with pytest.raises(UnicodeDecodeError):
        first.content.decode("utf-8")


def test_echo_reports_the_request_with_a_chunked_body(upstream: FakeUpstream) -> None:
    def parts() -> Iterator[bytes]:
        yield b'{"streamed": '
        yield b"true}"

    with httpx.Client(base_url=upstream.url) as client:
        response = client.post("/fake/echo?a=1&b=two", content=parts(), headers={"X-Key": "k1"})
    echo = response.json()
    assert echo["method"] == "POST"
    assert echo["path"] == "/fake/echo"
    assert echo["query"] == "a=1&b=two"
    assert ["X-Key", "k1"] in echo["headers"]
    assert ["Transfer-Encoding", "chunked"] in echo["headers"]
    assert echo["body"] == '{"streamed": true}'
    received = upstream.requests[0]
    assert received.body == b'{"streamed": true}'
    assert received.params() == {"a": ["1"], "b": ["two"]}


def test_echo_marks_a_binary_body(upstream: FakeUpstream) -> None:
    echo = httpx.put(f"{upstream.url}/fake/echo", content=b"\xff\x00").json()
    assert echo["method"] == "PUT"
    assert echo["body"] is None
    assert echo["body_base64"] == "/wA="


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_reset_cuts_the_stream_after_n_events(tls: bool) -> None:
    with FakeUpstream(tls=tls) as server:
        verify = trusting(server) if tls else True
        received = []
        with (
            httpx.Client(verify=verify) as client,
            client.stream("GET", f"{server.url}/fake/reset?after=3") as response,
            # Python's ssl reports a reset under TLS as an unexpected EOF, hence two errors.
            pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)),
        ):
            for chunk in response.iter_raw():
                received.append(chunk)
    assert len(received) == 3


def test_reset_is_a_tcp_reset(upstream: FakeUpstream) -> None:
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(b"GET /fake/reset?after=0 HTTP/1.1\r\nhost: x\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            while sock.recv(65536):
                pass


def test_hang_never_answers_and_stop_does_not_wait_for_it() -> None:
    server = FakeUpstream().start_in_thread()
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{server.url}/fake/hang", timeout=0.3)
        assert server.request_count == 1
        held = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        held.sendall(b"GET /fake/hang HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.05)
    finally:
        started = time.monotonic()
        server.stop_thread()
        stop_time = time.monotonic() - started
    assert stop_time < 1.0
    assert held.recv(10) == b""  # closed by the stop, never answered
    held.close()


def test_stop_is_prompt_with_a_client_silent_in_the_tls_handshake() -> None:
    server = FakeUpstream(tls=True).start_in_thread()
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        time.sleep(0.05)
    finally:
        started = time.monotonic()
        server.stop_thread()
        stop_time = time.monotonic() - started
        silent.close()
    assert stop_time < 1.0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def test_status_answers_with_the_requested_code(upstream: FakeUpstream) -> None:
    with httpx.Client(base_url=upstream.url) as client:
        failed = client.get("/fake/status?code=503")
        empty = client.get("/fake/status?code=204")
        refused = client.get("/fake/status?code=99")
    assert failed.status_code == 503
    assert failed.json()["error"]["code"] == 503
    assert empty.status_code == 204 and empty.content == b""
    assert refused.status_code == 400


def test_json_is_about_the_requested_size(upstream: FakeUpstream) -> None:
    response = httpx.get(f"{upstream.url}/fake/json?size=5000")
    assert abs(len(response.content) - 5000) <= 50
    assert len(response.json()["items"]) > 10


def test_api_errors_have_each_api_shape(upstream: FakeUpstream) -> None:
    with httpx.Client(base_url=upstream.url) as client:
        anthropic_error = client.post("/v1/messages", content=b"{not json")
        openai_error = client.post("/v1/chat/completions", content=b"[1]")
        missing = client.get("/v2/nothing")
        wrong_method = client.get("/v1/chat/completions")
    assert anthropic_error.status_code == 400
    assert anthropic_error.json()["type"] == "error"
    assert anthropic_error.json()["error"]["type"] == "invalid_request_error"
    assert openai_error.status_code == 400
    assert openai_error.json()["error"]["type"] == "invalid_request_error"
    assert missing.status_code == 404
    assert wrong_method.status_code == 405


# HTTP/1.1 behaviour.


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """Read one Content-Length response from `buffer` + `sock`; return its head and body."""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    buffer[:] = rest[length:]
    return head, rest[:length]


def test_pipelined_requests_share_one_connection(upstream: FakeUpstream) -> None:
    pipelined = (
        b"POST /fake/echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\ntrailer: t\r\n\r\n"
        b"POST /fake/echo?second HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
    )
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(pipelined)
        buffer = bytearray()
        first_head, first = read_response(sock, buffer)
        second_head, second = read_response(sock, buffer)
    assert first_head.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(first)["body"] == "abcde"
    assert json.loads(second)["query"] == "second"
    assert json.loads(second)["body"] == "hi"
    assert b"connection: close" not in second_head
    assert (upstream.request_count, upstream.connection_count) == (2, 1)


def test_expect_continue_gets_an_interim_response(upstream: FakeUpstream) -> None:
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(
            b"POST /fake/echo HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n"
            b"expect: 100-continue\r\nconnection: close\r\n\r\n"
        )
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        buffer = bytearray()
        head, body = read_response(sock, buffer)
        assert sock.recv(10) == b""  # connection: close was honoured
    assert b"connection: close" in head
    assert json.loads(body)["body"] == "body"


def test_malformed_request_gets_400(upstream: FakeUpstream) -> None:
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 400 Bad Request")


def test_counts_are_exact_under_concurrent_clients(upstream: FakeUpstream) -> None:
    def hammer() -> None:
        with httpx.Client(base_url=upstream.url) as client:
            for _ in range(10):
                client.get("/v1/models").raise_for_status()

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert upstream.request_count == 80
    assert len(upstream.requests) == 80
    assert upstream.connection_count == 8
    upstream.clear()
    assert (upstream.request_count, upstream.requests) == (0, [])


# TLS details, the in-loop API and the command line.


def test_tls_offers_only_http11_and_covers_localhost(tls_upstream: FakeUpstream) -> None:
    context = trusting(tls_upstream)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", tls_upstream.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        assert sock.selected_alpn_protocol() == "http/1.1"
    response = httpx.get(f"https://localhost:{tls_upstream.port}/v1/models", verify=context)
    assert response.status_code == 200


def test_cert_dir_keeps_the_ca_where_asked(tmp_path) -> None:
    with FakeUpstream(tls=True, cert_dir=str(tmp_path)) as server:
        assert server.ca_path == str(tmp_path / "fake-upstream-ca.pem")
        assert server.url.startswith("https://127.0.0.1:")
    assert (tmp_path / "fake-upstream-ca.pem").read_bytes().startswith(b"-----BEGIN CERTIFICATE")


def test_start_and_stop_inside_a_running_loop() -> None:
    async def run() -> tuple[int, str]:
        async with FakeUpstream() as server, httpx.AsyncClient() as client:
            url = server.url
            response = await client.get(f"{url}/v1/models")
        return response.status_code, url

    status, url = asyncio.run(run())
    assert status == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/models")


def test_cli_prints_its_url_and_ca_then_exits_cleanly_on_sigterm() -> None:
    command = [sys.executable, "-m", "wiretape.fake_upstream", "--tls", "--port", "0"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            ready, _, _ = select.select([process.stdout], [], [], 10)
            assert ready, "the fake upstream printed nothing in 10 s"
            listening = process.stdout.readline().strip()
            ca_line = process.stdout.readline().strip()
            match = re.fullmatch(r"listening on (https://127\.0\.0\.1:\d+)", listening)
            assert match, listening
            assert ca_line.startswith("ca ")
            context = ssl.create_default_context(cafile=ca_line.removeprefix("ca "))
            response = httpx.get(f"{match.group(1)}/v1/models", verify=context)
            assert response.status_code == 200
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5) == 0
            assert process.stderr.read() == ""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
