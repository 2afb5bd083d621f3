"""Matching, field diffs and headlines, in process: the engine behind replay and diff."""

from __future__ import annotations

import tracemalloc

import pytest
from wiretape.fielddiff import diff_values
from wiretape.headlines import headline
from wiretape.matching import MatchRules, drop_json_path, match_key, parse_json_path
from wiretape.redact import Redactor
from wiretape.replay import Replayer
from wiretape.tapes import Exchange, Request, Response, TapeWriter

CHAT = "https://api.openai.com/v1/chat/completions"


def req(body: bytes = b"{}", url: str = CHAT, headers=(), method: str = "POST") -> Request:
    return Request(method, url, "HTTP/1.1", list(headers), body)


def tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {}}}


HEADLINES = [
    (
        "openai system prompt",
        {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "q"}]},
        {"messages": [{"role": "system", "content": "b"}, {"role": "user", "content": "q"}]},
        "system prompt changed",
    ),
    (
        "message added",
        {"messages": [{"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "r"}]},
        "message 2 added",
    ),
    (
        "user message changed",
        {"messages": [{"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "Q"}]},
        "message 1 (user) changed",
    ),
    ("model", {"model": "a"}, {"model": "b"}, "model changed"),
    ("anthropic system", {"system": "a"}, {"system": "b"}, "system prompt changed"),
    (
        "anthropic tool parameters",
        {"tools": [{"name": "t", "input_schema": {}}]},
        {"tools": [{"name": "t", "input_schema": {"type": "object"}}]},
        "tool t: parameters changed",
    ),
    (
        "responses instructions",
        {"instructions": "a"},
        {"instructions": "b"},
        "system prompt changed",
    ),
    ("responses input", {"input": "x"}, {"input": "y"}, "input changed"),
    (
        "gemini system",
        {"systemInstruction": {"parts": [{"text": "a"}]}},
        {"systemInstruction": {"parts": [{"text": "b"}]}},
        "system prompt changed",
    ),
    (
        "gemini declaration added",
        {"tools": [{"functionDeclarations": [{"name": "a"}]}]},
        {"tools": [{"functionDeclarations": [{"name": "a"}, {"name": "b"}]}]},
        "tool b added",
    ),
    (
        "openai tool parameters",
        {"tools": [tool("get_weather")]},
        {"tools": [tool("get_weather", {"type": "object"})]},
        "tool get_weather: parameters changed",
    ),
    (
        "tool added",
        {"tools": [tool("a")]},
        {"tools": [tool("a"), tool("b")]},
        "tool b added",
    ),
    ("tool removed", {"tools": [tool("a"), tool("b")]}, {"tools": [tool("a")]}, "tool b removed"),
    ("plain field", {"temperature": 0.1}, {"temperature": 0.2}, "temperature changed"),
    ("nested plain field", {"metadata": {"x": 1}}, {"metadata": {"x": 2}}, "metadata.x changed"),
]


@pytest.mark.parametrize(
    ("old", "new", "expected"), [c[1:] for c in HEADLINES], ids=[c[0] for c in HEADLINES]
)
def test_headline_says_what_changed_in_each_api_shape(old, new, expected):
    assert headline(diff_values(old, new), old, new) == expected


def test_field_diffs_are_json_paths_with_both_values():
    old = {"messages": [{"role": "user", "content": "a"}], "n": 1}
    new = {"messages": [{"role": "user", "content": "b"}, {"role": "user"}], "m": 2}
    diffs = {d.path: d.to_json() for d in diff_values(old, new)}
    assert diffs["messages[0].content"]["recorded"] == "a"
    assert diffs["messages[0].content"]["new"] == "b"
    assert diffs["messages[1]"]["change"] == "added"
    assert diffs["n"]["change"] == "removed"
    assert diffs["m"]["change"] == "added"


def test_an_int_and_a_float_of_equal_value_differ_but_key_order_does_not():
    assert diff_values({"t": 1}, {"t": 1.0})
    a = match_key(req(b'{"a":1,"b":[1,2]}'), MatchRules())
    b = match_key(req(b'{"b":[1,2],  "a":1}'), MatchRules())
    assert a == b


def test_match_keys_ignore_volatile_headers_query_order_and_placeholder_tags():
    volatile = [
        ("Authorization", "Bearer x"),
        ("User-Agent", "a"),
        ("x-stainless-os", "Linux"),
        ("traceparent", "00-1"),
    ]
    a = match_key(req(url=CHAT + "?b=2&a=1&key=[REDACTED:secret-param:aaaaaaaaaaaa]"), MatchRules())
    b = match_key(
        req(url=CHAT + "?a=1&b=2&key=[REDACTED:secret-param:bbbbbbbbbbbb]", headers=volatile),
        MatchRules(),
    )
    assert a == b
    kept = match_key(req(headers=[("anthropic-version", "2023-06-01")]), MatchRules())
    assert kept != match_key(req(), MatchRules())
    ignored = MatchRules.build(["Anthropic-Version"])
    assert match_key(req(headers=[("anthropic-version", "x")]), ignored) == match_key(
        req(), ignored
    )


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("metadata.run_id", ("metadata", "run_id")),
        ("messages[*].id", ("messages", "*", "id")),
        ("tools[0].function.description", ("tools", 0, "function", "description")),
    ],
)
def test_json_paths_parse(path, parts):
    assert parse_json_path(path) == parts


@pytest.mark.parametrize("bad", ["", ".a", "a..b", "a[x]", "a[1", "a]"])
def test_bad_json_paths_are_refused(bad):
    with pytest.raises(ValueError):
        parse_json_path(bad)


def test_dropping_a_json_path_removes_only_that_field():
    value = {"messages": [{"id": 1, "c": "x"}, {"id": 2, "c": "y"}], "metadata": {"run_id": 5}}
    assert drop_json_path(value, ("messages", "*", "id")) == {
        "messages": [{"c": "x"}, {"c": "y"}],
        "metadata": {"run_id": 5},
    }
    assert drop_json_path(value, ("nothing", "here")) == value


def write(path, requests: list[Request]) -> None:
    with TapeWriter(path, redaction={}) as writer:
        for seq, request in enumerate(requests, 1):
            body = b'{"answer":%d}' % seq
            writer.append(Exchange(seq, 0, request, Response(200, "OK", "HTTP/1.1", [], body)))


@pytest.fixture
def redactor() -> Redactor:
    return Redactor(b"k" * 32)


def test_identical_requests_are_served_in_recorded_order(tmp_path, redactor):
    tape = tmp_path / "same.tape"
    write(tape, [req(b'{"q":1}')] * 3)
    replayer = Replayer(tape, redactor)
    answers = [replayer.lookup(req(b'{"q":1}')).response.body for _ in range(3)]
    assert answers == [b'{"answer":1}', b'{"answer":2}', b'{"answer":3}']
    assert replayer.lookup(req(b'{"q":1}')).response.status == 404
    assert replayer.report().miss_count == 1


def test_concurrent_requests_in_another_order_match_and_are_reported_as_order(tmp_path, redactor):
    tape = tmp_path / "order.tape"
    write(tape, [req(b'{"q":1}'), req(b'{"q":2}')])
    relaxed = Replayer(tape, redactor)
    assert relaxed.lookup(req(b'{"q":2}')).response.body == b'{"answer":2}'
    assert relaxed.lookup(req(b'{"q":1}')).response.body == b'{"answer":1}'
    report = relaxed.report()
    assert not report.diverged and report.out_of_order_count == 1
    strict = Replayer(tape, redactor, strict_order=True)
    strict.lookup(req(b'{"q":2}'))
    strict.lookup(req(b'{"q":1}'))
    assert strict.report().diverged


def test_replay_memory_does_not_grow_with_requests_served(tmp_path, redactor):
    tape = tmp_path / "big.tape"
    write(tape, [req(b'{"q":%d}' % n) for n in range(2_000)])
    replayer = Replayer(tape, redactor, allow_repeats=True)
    requests = [req(b'{"q":%d}' % (n % 2_000)) for n in range(20_000)]

    def serve(batch):
        for request in batch:
            assert replayer.lookup(request).response.status == 200

    tracemalloc.start()  # before warming up, so what the caches later drop is tracked too
    serve(requests[:4_000])  # warm: every exchange served at least once, caches full
    before = tracemalloc.take_snapshot()
    serve(requests[4_000:])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 32_000, f"{grown} bytes more after 16,000 more requests"  # 2 B/request
    replayer.close()
