"""End to end: record with real clients, then replay offline and check the verdict."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import SCENARIOS, WIRETAPE, direct_env, pyclient, run, wiretape
from wiretape.fake_upstream import FakeUpstream
from wiretape.tapes import Exchange, Request, Response, TapeWriter


def record(tape: Path, command: list[str], env, upstream, *options: str):
    result = wiretape(
        "record",
        str(tape),
        "--upstream-ca",
        upstream.ca_path,
        "-q",
        *options,
        "--",
        *command,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result


def replay(tape: Path, command: list[str], env, *options: str):
    return wiretape("replay", str(tape), *options, "--", *command, env=env)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_replay_gives_the_recorded_output_and_sends_nothing_upstream(
    scenario, tmp_path, env, upstream
):
    tape = tmp_path / "run.tape"
    recorded = record(tape, pyclient(scenario, upstream.url), env, upstream)
    upstream.clear()
    replayed = replay(tape, pyclient(scenario, upstream.url), env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == recorded.stdout
    assert upstream.request_count == 0  # the counting upstream saw nothing
    assert "no divergence" in replayed.stderr


def test_replay_works_with_the_upstream_stopped(tmp_path, env):
    tape = tmp_path / "offline.tape"
    with FakeUpstream(tls=True) as gone:
        record(tape, pyclient("openai-stream", gone.url), env, gone)
        direct = run(pyclient("openai-stream", gone.url), direct_env(env, gone))
        url = gone.url
    replayed = replay(tape, pyclient("openai-stream", url), env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == direct.stdout


def agent_script(upstream, system: str, tools: list[str]) -> list[str]:
    tool_defs = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in tools
    ]
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Plan my day"},
        ],
    }
    if tool_defs:
        body["tools"] = tool_defs
    code = (
        "import httpx, json, sys\n"
        f"r = httpx.post({upstream.url + '/v1/chat/completions'!r}, json={body!r})\n"
        "print(r.status_code, r.json().get('choices', [{}])[0].get('finish_reason'))\n"
    )
    return [sys.executable, "-c", code]


def test_a_changed_prompt_fails_with_a_report_naming_the_field(tmp_path, env, upstream):
    tape, report = tmp_path / "prompt.tape", tmp_path / "report.json"
    record(tape, agent_script(upstream, "You are terse.", ["get_weather"]), env, upstream)
    changed = agent_script(upstream, "You are chatty.", ["get_weather"])
    result = replay(tape, changed, env, "--report", str(report))
    assert result.returncode == 1
    assert "system prompt changed" in result.stderr
    assert "messages[0].content" in result.stderr
    verdict = json.loads(report.read_text())
    assert verdict["diverged"] is True
    (miss,) = verdict["misses"]
    assert miss["position"] == 1 and miss["nearest"]["seq"] == 1
    assert miss["differences"] == [
        {
            "path": "messages[0].content",
            "change": "changed",
            "recorded": "You are terse.",
            "new": "You are chatty.",
        }
    ]
    assert result.stdout.startswith("404")  # an answer the client does not retry


def test_an_added_tool_is_named_in_the_report(tmp_path, env, upstream):
    tape = tmp_path / "tools.tape"
    record(tape, agent_script(upstream, "S", ["get_weather"]), env, upstream)
    result = replay(tape, agent_script(upstream, "S", ["get_weather", "book_table"]), env)
    assert result.returncode == 1
    assert "tool book_table added" in result.stderr


def test_one_request_more_than_recorded_is_a_miss_unless_repeats_are_allowed(
    tmp_path, env, upstream
):
    tape = tmp_path / "once.tape"
    once = [sys.executable, "-c", f"import httpx; httpx.get({upstream.url!r} + '/fake/json')"]
    twice = [
        sys.executable,
        "-c",
        f"import httpx\nfor _ in range(2): print(httpx.get({upstream.url!r} + '/fake/json')"
        ".status_code)",
    ]
    record(tape, once, env, upstream)
    strict = replay(tape, twice, env)
    assert strict.returncode == 1
    assert strict.stdout.split() == ["200", "404"]
    assert "repeated more often than recorded" in strict.stderr
    relaxed = replay(tape, twice, env, "--allow-repeats")
    assert relaxed.returncode == 0, relaxed.stderr
    assert relaxed.stdout.split() == ["200", "200"]


def test_ignored_json_paths_and_headers_do_not_count(tmp_path, env, upstream):
    def client(run_id: str) -> list[str]:
        code = (
            "import httpx\n"
            f"r = httpx.post({upstream.url!r} + '/fake/echo', "
            f"json={{'metadata': {{'run_id': {run_id!r}}}, 'q': 1}}, "
            f"headers={{'x-trace': {run_id!r}}})\n"
            "print(r.status_code)\n"
        )
        return [sys.executable, "-c", code]

    tape = tmp_path / "volatile.tape"
    record(tape, client("run-1"), env, upstream)
    assert replay(tape, client("run-2"), env).returncode == 1
    ignoring = replay(
        tape,
        client("run-2"),
        env,
        "--ignore-json-path",
        "metadata.run_id",
        "--ignore-header",
        "x-trace",
    )
    assert ignoring.returncode == 0, ignoring.stderr


def test_a_recorded_request_never_made_is_a_divergence(tmp_path, env, upstream):
    tape = tmp_path / "two.tape"
    both = (
        f"import httpx\nhttpx.get({upstream.url!r} + '/fake/json?size=10')\n"
        f"httpx.get({upstream.url!r} + '/fake/json?size=20')\n"
    )
    record(tape, [sys.executable, "-c", both], env, upstream)
    first_only = f"import httpx; httpx.get({upstream.url!r} + '/fake/json?size=10')"
    result = replay(tape, [sys.executable, "-c", first_only], env)
    assert result.returncode == 1
    assert "never requested: exchange #2" in result.stderr


def test_bad_tapes_are_refused_before_serving(tmp_path, env, upstream):
    tape = tmp_path / "bad.tape"
    record(
        tape, [sys.executable, "-c", f"import httpx; httpx.get({upstream.url!r})"], env, upstream
    )
    data = tape.read_bytes()
    tampered = tmp_path / "tampered.tape"
    tampered.write_bytes(data.replace(b'"GET"', b'"PUT"'))
    truncated = tmp_path / "truncated.tape"
    truncated.write_bytes(data[: len(data) - 40])
    for bad in (tampered, truncated):
        result = replay(bad, ["sh", "-c", "echo ran"], env)
        assert result.returncode == 3
        assert "ran" not in result.stdout  # nothing was served, the command never ran
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.stderr


def test_serve_prints_its_address_first_and_the_report_when_stopped(tmp_path, env, upstream):
    tape = tmp_path / "served.tape"
    record(tape, pyclient("openai-chat", upstream.url), env, upstream)
    process = subprocess.Popen(
        [WIRETAPE, "serve", str(tape), "--listen", "127.0.0.1:0", "--report", "r.json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = process.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:")
        shell = f'eval "$({WIRETAPE} env --listen {address[7:]})"; ' + " ".join(
            pyclient("openai-chat", upstream.url)
        )
        client = run(["bash", "-c", shell], env)
        assert client.returncode == 0, client.stderr
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0
    assert "no divergence: 1 request(s) matched" in stderr
    assert orjson.loads((tmp_path / "r.json").read_bytes())["diverged"] is False


def test_a_tape_recorded_in_proxy_mode_replays_in_base_url_mode(tmp_path, env, upstream):
    tape = tmp_path / "modes.tape"
    recorded = record(tape, pyclient("openai-stream", upstream.url), env, upstream)
    script = f'{sys.executable} {pyclient("x", "")[1]} openai-stream "$WIRETAPE_BASE_URL"'
    replayed = wiretape(
        "replay", str(tape), "--reverse", upstream.url, "--", "sh", "-c", script, env=env
    )
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == recorded.stdout


def write_tape(path: Path, bodies: list[bytes]) -> None:
    with TapeWriter(path, redaction={}) as writer:
        for seq, body in enumerate(bodies, 1):
            request = Request(
                "POST",
                "https://api.openai.com/v1/chat/completions",
                "HTTP/1.1",
                [("content-type", "application/json")],
                body,
            )
            writer.append(Exchange(seq, 0, request, Response(200, "OK", "HTTP/1.1", [], b"{}")))


def test_diff_aligns_two_tapes_and_names_the_first_divergence(tmp_path, env):
    a, b, same = tmp_path / "a.tape", tmp_path / "b.tape", tmp_path / "same.tape"
    write_tape(a, [b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'] * 1)
    write_tape(same, [b'{"messages":[{"role":"user","content":"hi"}],"model":"m"}'])
    write_tape(b, [b'{"model":"m2","messages":[{"role":"user","content":"hi"}]}'])
    identical = wiretape("diff", str(a), str(same), env=env)
    assert identical.returncode == 0, identical.stdout + identical.stderr
    differs = wiretape("diff", str(a), str(b), "--json", env=env)
    assert differs.returncode == 1
    verdict = orjson.loads(differs.stdout)
    assert verdict["diverged"] is True and verdict["first_divergence"] == 1
    assert verdict["misses"][0]["headline"] == "model changed"


def test_recorded_upstream_failures_replay_as_the_same_failure(tmp_path, env, upstream):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    code = (
        "import httpx\n"
        "for url in ("
        + repr(f"https://127.0.0.1:{dead}/x")
        + ", "
        + repr(upstream.url + "/fake/reset?after=2&interval_ms=10")
        + "):\n"
        "    got = b''\n"
        "    try:\n"
        "        with httpx.stream('GET', url) as r:\n"
        "            for piece in r.iter_raw(): got += piece\n"
        "        print('whole', len(got))\n"
        "    except httpx.HTTPError as exc:\n"
        "        print('failed after', got.count(b'data:'), 'events')\n"
    )
    tape = tmp_path / "failures.tape"
    recorded = record(tape, [sys.executable, "-c", code], env, upstream)
    assert recorded.stdout.splitlines() == ["failed after 0 events", "failed after 2 events"]
    replayed = replay(tape, [sys.executable, "-c", code], env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == recorded.stdout


def test_sixty_four_concurrent_streams_replay_whatever_the_arrival_order(tmp_path, env, upstream):
    code = (
        "import asyncio, httpx, random\n"
        "async def one(client, n):\n"
        "    await asyncio.sleep(random.random() / 20)\n"
        f"    r = await client.get({upstream.url!r} + f'/fake/sse?events=5&id={{n}}')\n"
        "    return r.text\n"
        "async def main():\n"
        "    limits = httpx.Limits(max_connections=64)\n"
        "    async with httpx.AsyncClient(limits=limits, timeout=60) as client:\n"
        "        texts = await asyncio.gather(*(one(client, n) for n in range(64)))\n"
        "    print(sum(t.count('data:') for t in texts), len(set(texts)))\n"
        "asyncio.run(main())\n"
    )
    tape = tmp_path / "many.tape"
    recorded = record(tape, [sys.executable, "-c", code], env, upstream)
    assert recorded.stdout.split() == ["320", "64"] or recorded.stdout.split()[0] == "320"
    upstream.clear()
    replayed = replay(tape, [sys.executable, "-c", code], env, "-q")
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == recorded.stdout
    assert upstream.request_count == 0


def test_pace_recorded_keeps_the_gaps_and_fast_does_not(tmp_path, env, upstream):
    code = (
        "import httpx, time\n"
        f"with httpx.stream('GET', {upstream.url!r} + '/fake/sse?events=5&interval_ms=60') as r:\n"
        "    arrivals = [time.monotonic() for _ in r.iter_raw()]\n"
        "print(round(arrivals[-1] - arrivals[0], 2))\n"
    )
    tape = tmp_path / "paced.tape"
    record(tape, [sys.executable, "-c", code], env, upstream)
    fast = replay(tape, [sys.executable, "-c", code], env)
    paced = replay(tape, [sys.executable, "-c", code], env, "--pace", "recorded")
    assert fast.returncode == paced.returncode == 0
    assert float(fast.stdout) < 0.12  # the four recorded gaps of 60 ms are skipped
    assert float(paced.stdout) >= 0.2  # and kept (loosely: this box is shared)


def test_on_miss_forward_records_the_new_requests_on_a_new_tape(tmp_path, env, upstream):
    first = f"import httpx; print(httpx.get({upstream.url!r} + '/fake/json?size=10').status_code)"
    both = (
        f"import httpx\nprint(httpx.get({upstream.url!r} + '/fake/json?size=10').status_code)\n"
        f"print(httpx.get({upstream.url!r} + '/fake/json?size=99').status_code)\n"
    )
    tape, grown = tmp_path / "base.tape", tmp_path / "new.tape"
    record(tape, [sys.executable, "-c", first], env, upstream)
    upstream.clear()
    result = replay(
        tape,
        [sys.executable, "-c", both],
        env,
        "--on-miss",
        "forward",
        "--record-new",
        str(grown),
        "--upstream-ca",
        upstream.ca_path,
    )
    assert result.stdout.split() == ["200", "200"], result.stderr
    assert upstream.request_count == 1  # only the miss went upstream
    from wiretape.tapes import load_tape

    (added,) = load_tape(grown).exchanges
    assert added.request.url.endswith("/fake/json?size=99")
    assert added.response.status == 200
    assert (
        wiretape("replay", str(tape), "--record-new", str(grown), "--", "true", env=env).returncode
        == 2
    )
