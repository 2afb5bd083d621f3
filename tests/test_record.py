"""End to end: `wiretape record -- COMMAND` with real clients against the TLS fake upstream."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from conftest import SCENARIOS, WIRETAPE, direct_env, pyclient, run, wiretape
from wiretape.tapes import TruncatedTapeError, load_tape, verify_tape


def record(tape: Path, command: list[str], env, upstream, *options: str):
    return wiretape(
        "record", str(tape), "--upstream-ca", upstream.ca_path, *options, "--", *command, env=env
    )


def everything_on_disk(*roots: Path) -> bytes:
    return b"".join(p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recorded_client_sees_what_it_sees_direct(scenario, tmp_path, env, upstream):
    direct = run(pyclient(scenario, upstream.url), direct_env(env, upstream))
    assert direct.returncode == 0, direct.stderr
    tape = tmp_path / "run.tape"
    recorded = record(tape, pyclient(scenario, upstream.url), env, upstream)
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout == direct.stdout
    summary = verify_tape(tape)
    assert summary.exchanges >= 1
    assert "Traceback" not in recorded.stderr


def test_streamed_chunks_keep_the_boundaries_the_upstream_sent(tmp_path, env, upstream):
    tape = tmp_path / "sse.tape"
    url = f"{upstream.url}/fake/sse?events=6&interval_ms=30"
    result = record(tape, ["curl", "-sS", "--http1.1", url], env, upstream)
    assert result.returncode == 0, result.stderr
    (exchange,) = load_tape(tape).exchanges
    chunks = exchange.response.chunks
    assert [c.data for c in chunks] == [
        b'id: %d\ndata: {"n":%d,"of":6}\n\n' % (n, n) for n in range(6)
    ]
    gaps = [b.at_us - a.at_us for a, b in itertools.pairwise(chunks)]
    assert all(gap > 15_000 for gap in gaps), gaps  # 30 ms apart upstream, never merged
    assert result.stdout.encode() == b"".join(c.data for c in chunks)


def test_secrets_never_reach_disk(tmp_path, env, upstream, planted, wiretape_home):
    tape = tmp_path / "secrets.tape"
    for scenario in ("requests-json", "openai-chat", "anthropic"):
        result = record(
            tape, pyclient(scenario, upstream.url), env, upstream, "--overwrite", "--quiet"
        )
        assert result.returncode == 0, result.stderr
        on_disk = everything_on_disk(tmp_path, wiretape_home)
        for secret in planted.all():
            assert secret.encode() not in on_disk, f"{secret[:8]}… leaked in {scenario}"
    # The upstream did get the real keys: redaction happens on the tape, not on the wire.
    seen = b"".join(r.body + repr(r.headers).encode() for r in upstream.requests)
    assert planted.openai.encode() in seen and planted.github.encode() in seen
    text = tape.read_text()
    assert "[REDACTED:" in text


def test_two_keys_stay_two_placeholders(tmp_path, env, upstream, planted):
    tape = tmp_path / "two.tape"
    other = "sk-proj-" + "B" * 48
    script = (
        "import httpx, sys\n"
        f"for key in ({planted.openai!r}, {other!r}, {planted.openai!r}):\n"
        f"    httpx.get({upstream.url!r} + '/fake/echo',\n"
        "              headers={'authorization': 'Bearer ' + key})\n"
    )
    result = record(tape, [sys.executable, "-c", script], env, upstream)
    assert result.returncode == 0, result.stderr
    values = [
        dict((k.lower(), v) for k, v in e.request.headers)["authorization"]
        for e in sorted(load_tape(tape).exchanges, key=lambda e: e.seq)
    ]
    assert values[0] == values[2] != values[1]
    assert all(v.startswith("Bearer [REDACTED:") for v in values)


def test_upstream_refused_is_recorded_and_the_client_sees_a_connection_failure(
    tmp_path, env, upstream
):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    tape = tmp_path / "refused.tape"
    script = (
        "import httpx\n"
        "try:\n"
        f"    httpx.get('https://127.0.0.1:{dead}/v1/models')\n"
        "except httpx.HTTPError as exc:\n"
        "    print('failed', type(exc).__name__)\n"
        "else:\n"
        "    print('answered')\n"
    )
    result = record(tape, [sys.executable, "-c", script], env, upstream)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("failed"), result.stdout
    (exchange,) = load_tape(tape).exchanges
    assert exchange.response is None
    assert exchange.error.kind == "refused"


def test_reset_mid_stream_is_recorded_with_the_chunks_that_arrived(tmp_path, env, upstream):
    tape = tmp_path / "reset.tape"
    url = f"{upstream.url}/fake/reset?after=3&interval_ms=20"
    result = record(tape, ["curl", "-sS", "--http1.1", url], env, upstream)
    assert result.returncode != 0  # curl saw the stream break, as it would going direct
    (exchange,) = load_tape(tape).exchanges
    assert exchange.error.kind == "reset"
    assert exchange.error.after_chunks == 3
    assert len(exchange.response.chunks) == 3


def test_sixty_four_concurrent_streams_are_recorded_whole(tmp_path, env, upstream):
    tape = tmp_path / "many.tape"
    script = (
        "import asyncio, httpx\n"
        "async def one(client, n):\n"
        f"    url = {upstream.url!r} + f'/fake/sse?events=8&interval_ms=5&id={{n}}'\n"
        "    r = await client.get(url)\n"
        "    return r.text.count('data:')\n"
        "async def main():\n"
        "    limits = httpx.Limits(max_connections=64)\n"
        "    async with httpx.AsyncClient(limits=limits, timeout=60) as client:\n"
        "        counts = await asyncio.gather(*(one(client, n) for n in range(64)))\n"
        "    print(sum(counts))\n"
        "asyncio.run(main())\n"
    )
    result = record(tape, [sys.executable, "-c", script], env, upstream, "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(64 * 8)
    exchanges = load_tape(tape).exchanges
    assert len(exchanges) == 64
    assert sorted(e.seq for e in exchanges) == list(range(1, 65))
    for exchange in exchanges:
        body = exchange.response.content.decode()
        assert body.count("data:") == 8, exchange.request.url
        assert exchange.request.url.endswith(f"id={exchange.request.url.rsplit('=', 1)[1]}")


def test_base_url_mode_stores_the_same_logical_url_as_proxy_mode(tmp_path, env, upstream):
    reverse_tape, proxy_tape = tmp_path / "reverse.tape", tmp_path / "proxy.tape"
    reverse = wiretape(
        "record",
        str(reverse_tape),
        "--reverse",
        upstream.url,
        "--upstream-ca",
        upstream.ca_path,
        "--",
        "sh",
        "-c",
        f'{sys.executable} {pyclient("openai-chat", "")[1]} openai-chat "$WIRETAPE_BASE_URL"',
        env=env,
    )
    assert reverse.returncode == 0, reverse.stderr
    proxied = record(proxy_tape, pyclient("openai-chat", upstream.url), env, upstream)
    assert proxied.returncode == 0, proxied.stderr
    assert reverse.stdout == proxied.stdout
    (a,) = load_tape(reverse_tape).exchanges
    (b,) = load_tape(proxy_tape).exchanges
    assert a.request.url == b.request.url == f"{upstream.url}/v1/chat/completions"
    assert load_tape(reverse_tape).header.meta == {"mode": "reverse", "upstream": upstream.url}


def test_the_command_exit_code_is_passed_on(tmp_path, env, upstream):
    result = record(tmp_path / "code.tape", ["sh", "-c", "exit 7"], env, upstream)
    assert result.returncode == 7
    assert verify_tape(tmp_path / "code.tape").exchanges == 0


def test_sigterm_goes_to_the_command_and_the_tape_is_sealed(tmp_path, env, upstream):
    tape = tmp_path / "term.tape"
    process = subprocess.Popen(
        [WIRETAPE, "record", str(tape), "--", "sh", "-c", "echo running; exec sleep 30"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "running\n"  # the proxy is up, the child runs
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=20)
    finally:
        process.kill()
    assert code == 128 + signal.SIGTERM  # the child died of SIGTERM, as a shell reports it
    verify_tape(tape)


def test_recording_alone_runs_until_sigterm_and_says_how_to_use_it(tmp_path, env, upstream):
    tape = tmp_path / "alone.tape"
    process = subprocess.Popen(
        [WIRETAPE, "record", str(tape), "--upstream-ca", upstream.ca_path],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = process.stderr.readline()
        assert "listening on http://127.0.0.1:" in first
        address = first.rsplit("http://", 1)[1].strip()
        instructions = process.stderr.readline() + process.stderr.readline()
        assert f'eval "$(wiretape env --listen {address})"' in instructions
        shell = (
            f'eval "$({WIRETAPE} env --listen {address})"; '
            f"curl -sS {upstream.url}/fake/json?size=100"
        )
        client = run(["bash", "-c", shell], env)
        assert client.returncode == 0, client.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()
    assert verify_tape(tape).exchanges == 1


def test_kill_9_mid_stream_leaves_a_repairable_tape(tmp_path, env, upstream):
    tape = tmp_path / "killed.tape"
    script = (
        "import httpx\n"
        f"for n in range(3): httpx.get({upstream.url!r} + f'/fake/json?size=50&n={{n}}')\n"
        f"httpx.get({upstream.url!r} + '/fake/sse?events=100&interval_ms=50', timeout=60)\n"
    )
    process = subprocess.Popen(
        [
            WIRETAPE,
            "record",
            str(tape),
            "--upstream-ca",
            upstream.ca_path,
            "--",
            sys.executable,
            "-c",
            script,
        ],
        env=env,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: tape.exists() and tape.read_bytes().count(b"\n") >= 4)
        time.sleep(0.5)  # well into the stream
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
    with pytest.raises(TruncatedTapeError) as cut:
        verify_tape(tape)
    assert cut.value.intact_exchanges == 3
    repaired = wiretape("verify", "--repair", str(tape), env=env)
    assert repaired.returncode == 0, repaired.stderr
    assert load_tape(tape).seal.recovered is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reverse", "ftp://nowhere"], "--reverse needs an http(s) URL"),
        (["--reverse", "https://api.openai.com/v1"], "--reverse takes only scheme"),
        (["--listen", "nonsense"], "HOST:PORT"),
        (["--", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, env, args, message):
    result = wiretape("record", str(tmp_path / "t.tape"), *args, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.tape").exists()


def test_an_existing_tape_is_not_overwritten_without_overwrite(tmp_path, env):
    tape = tmp_path / "keep.tape"
    tape.write_bytes(b"precious")
    result = wiretape("record", str(tape), "--", "true", env=env)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert tape.read_bytes() == b"precious"


def test_an_unwritable_path_and_a_busy_port_are_exit_2(tmp_path, env):
    missing = wiretape("record", str(tmp_path / "no" / "dir" / "t.tape"), "--", "true", env=env)
    assert missing.returncode == 2 and "cannot create" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = wiretape(
            "record",
            str(tmp_path / "t.tape"),
            "--listen",
            f"127.0.0.1:{port}",
            "--",
            "true",
            env=env,
        )
    assert taken.returncode == 2 and "cannot listen" in taken.stderr
    assert not (tmp_path / "t.tape").exists()


def test_ca_is_created_once_with_a_private_key_only_we_can_read(env, wiretape_home):
    first = wiretape("ca", env=env)
    assert first.returncode == 0
    path = Path(first.stdout.strip())
    assert path.read_text().startswith("-----BEGIN CERTIFICATE-----")
    key = path.with_name("mitmproxy-ca.pem")
    assert key.stat().st_mode & 0o777 == 0o600
    assert wiretape("ca", env=env).stdout == first.stdout


def test_env_prints_variables_a_shell_can_eval(env):
    result = wiretape("env", "--listen", "127.0.0.1:8123", env=env)
    assert result.returncode == 0
    shell = run(
        ["bash", "-c", result.stdout + 'echo "$HTTPS_PROXY $http_proxy $SSL_CERT_FILE"'], env
    )
    proxy, lower, bundle = shell.stdout.split()
    assert proxy == lower == "http://127.0.0.1:8123"
    assert "BEGIN CERTIFICATE" in Path(bundle).read_text()
    as_json = orjson.loads(wiretape("env", "--format", "json", env=env).stdout)
    assert as_json["REQUESTS_CA_BUNDLE"] == bundle


def _wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


def test_verify_secrets_passes_a_recorded_tape_and_flags_a_planted_key(tmp_path, env, upstream):
    tape = tmp_path / "scan.tape"
    result = record(tape, pyclient("requests-json", upstream.url), env, upstream)
    assert result.returncode == 0, result.stderr
    clean = wiretape("verify", "--secrets", str(tape), env=env)
    assert clean.returncode == 0, clean.stderr
    assert "nothing secret-shaped" in clean.stdout
    # A tape written without redaction: the scan must catch the key (exit 1), in a body
    # and in a credential header whatever its value looks like.
    from wiretape.tapes import Exchange, Request, Response, TapeWriter

    leaky = tmp_path / "leaky.tape"
    key = "sk-proj-" + "Z9" * 24
    with TapeWriter(leaky, redaction={}) as writer:
        request = Request(
            "POST", "https://x.test/", "HTTP/1.1", [("x-api-key", "hunter2")], key.encode()
        )
        writer.append(Exchange(1, 0, request, Response(200, "OK", "HTTP/1.1", [], body=b"")))
    found = wiretape("verify", "--secrets", str(leaky), env=env)
    assert found.returncode == 1
    assert "request.body: openai-key" in found.stderr
    assert "request.headers.x-api-key: secret-header" in found.stderr
    assert key not in found.stderr
