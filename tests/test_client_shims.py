"""End to end: the client shims, `env`, `doctor` and `shims install`, with real runtimes.

Each client records against a fake upstream, then replays with that upstream stopped: the
output must be the same and the upstream must have seen nothing more.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import COMMAND_TIMEOUT, WIRETAPE, run, wiretape
from wiretape.client_shims import NODE_PRELOAD, PYTHON_SHIM_DIR
from wiretape.client_shims.environment import combined, wiretape_variables
from wiretape.client_shims.installs import installed_undici, npm_environment
from wiretape.fake_upstream import FakeUpstream
from wiretape.tapes import Exchange, Request, Response, TapeWriter, load_tape

CLIENTS = Path(__file__).parent / "clients"
AIO_CLIENT = str(CLIENTS / "aio_client.py")
FETCH_CLIENT = str(CLIENTS / "fetch_client.mjs")
# Settings of the machine's own shell that would change what these tests see.
_SHIM_SETTINGS = (
    "PYTHONPATH",
    "NODE_OPTIONS",
    "NODE_USE_ENV_PROXY",
    "WIRETAPE_NODE_MODULES",
    "WIRETAPE_PROXY",
)
# npm's words for a registry it cannot reach: then the Node tests skip instead of failing.
_NPM_OFFLINE = ("ENOTFOUND", "ECONNREFUSED", "ETIMEDOUT", "EAI_AGAIN", "ECONNRESET", "network")


@pytest.fixture
def env(env) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in _SHIM_SETTINGS}


@pytest.fixture(scope="session")
def node_shim(wiretape_home) -> str:
    """undici for the Node preload, installed once by `wiretape shims install node`."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not on PATH")
    # The machine's own environment: npm's way to the registry (its proxy, its CAs) is there.
    try:
        done = subprocess.run(
            [WIRETAPE, "shims", "install", "node"],
            env={**os.environ, "WIRETAPE_HOME": str(wiretape_home)},
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("`wiretape shims install node` timed out: is the npm registry reachable?")
    if done.returncode != 0 and any(word in done.stderr for word in _NPM_OFFLINE):
        pytest.skip(f"the npm registry is unreachable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    version = installed_undici(wiretape_home)
    assert version is not None
    return version


@pytest.fixture(scope="session")
def go_client(tmp_path_factory) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH (Debian: apt-get install golang-go)")
    build = tmp_path_factory.mktemp("go")
    binary = build / "go_client"
    done = subprocess.run(
        [go, "build", "-o", str(binary), str(CLIENTS / "go_client.go")],
        env={**os.environ, "GOCACHE": str(build / "cache"), "GOFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        cwd=build,
    )
    assert done.returncode == 0, done.stderr
    return str(binary)


def record_then_replay_offline(
    tmp_path: Path,
    env: dict[str, str],
    command: Callable[[str], list[str]],
    *,
    tls: bool = True,
    reverse: bool = False,
):
    """Record `command(url)` against a fake upstream, stop it, replay: same output, and the
    upstream saw nothing during the replay. Returns the recording's result and the tape."""
    tape = tmp_path / "run.tape"
    with FakeUpstream(tls=tls) as upstream:
        url = upstream.url
        trust = ["--upstream-ca", upstream.ca_path] if tls else []
        mode = ["--reverse", url] if reverse else []
        recorded = wiretape("record", str(tape), *trust, *mode, "-q", "--", *command(url), env=env)
        assert recorded.returncode == 0, recorded.stderr
        served = upstream.request_count
    assert served > 0
    replayed = wiretape("replay", str(tape), *mode, "-q", "--", *command(url), env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == recorded.stdout
    assert "no divergence" in replayed.stderr
    assert upstream.request_count == served
    return recorded, tape


def urls(tape: Path) -> list[str]:
    return [e.request.url for e in sorted(load_tape(tape).exchanges, key=lambda e: e.seq)]


def test_aiohttp_is_recorded_and_replayed_through_the_sitecustomize_shim(tmp_path, env):
    recorded, tape = record_then_replay_offline(
        tmp_path, env, lambda url: [sys.executable, AIO_CLIENT, url]
    )
    assert "You said: Hi aio" in recorded.stdout
    assert [u.rsplit("/", 1)[1] for u in urls(tape)] == ["completions", "sse?events=4"]


def test_node_fetch_and_https_are_recorded_and_replayed_through_the_preload(
    tmp_path, env, node_shim
):
    recorded, tape = record_then_replay_offline(
        tmp_path, env, lambda url: ["node", FETCH_CLIENT, "all", url]
    )
    lines = [json.loads(line) for line in recorded.stdout.splitlines()]
    assert [line["kind"] for line in lines] == ["chat", "stream", "module-get"]
    assert "".join(p for p in lines[1]["pieces"] if p) == "You said: Stream from fetch"
    assert urls(tape)[2].endswith("/fake/json?size=300")  # https.get, not only fetch()


def test_curl_is_recorded_and_replayed(tmp_path, env):
    script = 'curl -sS "$0/fake/json?size=200" && curl -sS "$0/fake/sse?events=3"'
    recorded, tape = record_then_replay_offline(
        tmp_path, env, lambda url: ["sh", "-c", script, url]
    )
    assert recorded.stdout.count("data: ") == 3
    assert len(urls(tape)) == 2


@pytest.mark.parametrize("client", ["curl", "node"])
def test_a_connect_tunnel_to_a_plain_http_upstream_is_recorded_and_replayed(
    client, tmp_path, env, request
):
    # undici's proxy agent tunnels with CONNECT even to http:// targets; curl does on demand.
    if client == "node":
        request.getfixturevalue("node_shim")
        command = lambda url: ["node", FETCH_CLIENT, "fetch-chat", url]  # noqa: E731
    else:
        command = lambda url: ["curl", "-sS", "--proxytunnel", f"{url}/fake/json?size=100"]  # noqa: E731
    _, tape = record_then_replay_offline(tmp_path, env, command, tls=False)
    (url,) = urls(tape)
    assert url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_env_puts_the_shims_before_the_shells_own_values(shell, env):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    show = 'printf "%s\\n" "$PYTHONPATH" "$NODE_OPTIONS" "$NODE_USE_ENV_PROXY" "$http_proxy"'
    evaluate = f'eval "$({WIRETAPE} env --listen 127.0.0.1:8123)"; {show}'
    mine = run(
        [shell, "-c", f"export PYTHONPATH=/mine NODE_OPTIONS=--max-old-space-size=64; {evaluate}"],
        env,
    )
    assert mine.returncode == 0, mine.stderr
    assert mine.stdout.splitlines() == [
        f"{PYTHON_SHIM_DIR}:/mine",
        f"--require {NODE_PRELOAD} --max-old-space-size=64",
        "1",
        "http://127.0.0.1:8123",
    ]
    alone = run([shell, "-c", evaluate], env)
    assert alone.stdout.splitlines()[:2] == [str(PYTHON_SHIM_DIR), f"--require {NODE_PRELOAD}"]


def test_env_for_fish_extends_its_lists(env):
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    script = (
        "set -gx PYTHONPATH /mine; set -gx NODE_OPTIONS --max-old-space-size=64; "
        f"{WIRETAPE} env --listen 127.0.0.1:8123 --format fish | source; "
        'printf "%s\\n" "$PYTHONPATH" "$NODE_OPTIONS" "$https_proxy"'
    )
    shown = run(["fish", "-c", script], env)
    assert shown.stdout.splitlines() == [
        f"{PYTHON_SHIM_DIR}:/mine",
        f"--require {NODE_PRELOAD} --max-old-space-size=64",
        "http://127.0.0.1:8123",
    ]


def test_env_json_and_dotenv_give_final_values_and_base_url_mode_needs_no_shims(env):
    mine = {**env, "PYTHONPATH": "/mine"}
    as_json = json.loads(wiretape("env", "--format", "json", env=mine).stdout)
    assert as_json["PYTHONPATH"] == f"{PYTHON_SHIM_DIR}:/mine"
    assert as_json["NODE_OPTIONS"] == f"--require {NODE_PRELOAD}"
    dotenv = wiretape("env", "--format", "dotenv", env=mine).stdout.splitlines()
    assert f"PYTHONPATH={PYTHON_SHIM_DIR}:/mine" in dotenv
    reverse = wiretape(
        "env", "--reverse", "https://api.openai.com", "--format", "json", env=mine
    ).stdout
    assert json.loads(reverse) == {
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
        "WIRETAPE_BASE_URL": "http://127.0.0.1:8080",
        "OPENAI_BASE_URL": "http://127.0.0.1:8080/v1",
    }


def test_record_keeps_the_commands_own_pythonpath_and_node_options(tmp_path, env):
    mine = {**env, "PYTHONPATH": "/mine", "NODE_OPTIONS": "--max-old-space-size=64"}
    show = 'printf "%s\\n" "$PYTHONPATH" "$NODE_OPTIONS"'
    result = wiretape("record", str(tmp_path / "t.tape"), "-q", "--", "sh", "-c", show, env=mine)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{PYTHON_SHIM_DIR}:/mine",
        f"--require {NODE_PRELOAD} --max-old-space-size=64",
    ]


def _pythons() -> list[str]:
    found = [sys.executable]
    for candidate in ("/root/.pyenv/versions/3.8.18/bin/python3", shutil.which("python3.8")):
        if candidate and Path(candidate).exists():
            found.append(candidate)
            break
    return found


@pytest.mark.parametrize("python", _pythons())
def test_sitecustomize_chains_to_the_users_own_and_imports_nothing_itself(python, tmp_path, env):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import sys\nsys.their_sitecustomize_ran = True\n")
    probe = (
        "import sys, sitecustomize\n"
        "print(sitecustomize.__file__)\n"
        "print(getattr(sys, 'their_sitecustomize_ran', False))\n"
        "print(type(sys.meta_path[0]).__name__)\n"
        "print(sorted(m for m in ('aiohttp', 'asyncio', 'ssl') if m in sys.modules))\n"
    )
    shimmed = {
        **env,
        "PYTHONPATH": f"{PYTHON_SHIM_DIR}:{theirs}",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    result = run([python, "-c", probe], shimmed)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(theirs / "sitecustomize.py"),
        "True",
        "WiretapeImportHook",
        "[]",
    ]
    assert result.stderr == ""


def test_sitecustomize_makes_aiohttp_trust_the_environment_unless_told_not_to(env):
    probe = (
        "import asyncio, aiohttp\n"
        "async def main():\n"
        "    async with aiohttp.ClientSession() as a:\n"
        "        async with aiohttp.ClientSession(trust_env=False) as b:\n"
        "            print(a.trust_env, b.trust_env)\n"
        "asyncio.run(main())\n"
    )
    shimmed = {**env, "PYTHONPATH": str(PYTHON_SHIM_DIR)}
    proxied = run([sys.executable, "-c", probe], {**shimmed, "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert proxied.stdout.split() == ["True", "False"], proxied.stderr
    # No proxy variable, nothing to trust: aiohttp keeps its own default.
    assert run([sys.executable, "-c", probe], shimmed).stdout.split() == ["False", "False"]


def test_node_preload_without_undici_warns_once_and_changes_nothing(tmp_path, env):
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH")
    shimmed = {
        **env,
        "NODE_OPTIONS": f"--require {NODE_PRELOAD}",
        "WIRETAPE_NODE_MODULES": str(tmp_path / "nothing-here"),
    }
    script = [
        "node",
        "-e",
        "console.log(typeof fetch, require('https').globalAgent.constructor.name)",
    ]
    proxied = run(script, {**shimmed, "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert proxied.returncode == 0, proxied.stderr
    (warning,) = proxied.stderr.splitlines()
    assert warning.startswith("wiretape: fetch() is not routed through the proxy")
    assert "wiretape shims install node" in warning
    assert proxied.stdout.split() == ["function", "WiretapeTunnelAgent"]  # https still routed
    quiet = run(script, shimmed)  # no proxy variable: the preload does nothing at all
    assert (quiet.stdout.split(), quiet.stderr) == (["function", "Agent"], "")


def test_shims_install_node_puts_undici_6_under_wiretape_home(node_shim, wiretape_home):
    assert node_shim.split(".")[0] == "6"
    assert (wiretape_home / "node" / "node_modules" / "undici" / "package.json").is_file()


def test_npm_gets_the_shells_environment_without_wiretapes_routing(wiretape_home):
    proxy = "http://127.0.0.1:8123"
    shell = {
        **combined(wiretape_variables(proxy, None, wiretape_home), {"NODE_OPTIONS": "--x"}),
        "HTTPS_PROXY": proxy,
        "ALL_PROXY": "http://corporate:3128",
    }
    npm = npm_environment(shell)
    assert not {"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} & npm.keys()
    assert npm["ALL_PROXY"] == "http://corporate:3128"  # the user's own proxy stays
    assert npm["NODE_OPTIONS"] == "--x"


def test_doctor_passes_against_a_replay_server_and_sees_undici_tunnel_to_plain_http(
    tmp_path, env, node_shim
):
    tape = tmp_path / "doctor.tape"
    with FakeUpstream(tls=False) as upstream:
        authority = upstream.url.removeprefix("http://")
        client = ["node", FETCH_CLIENT, "fetch-chat", upstream.url]
        recorded = wiretape("record", str(tape), "-q", "--", *client, env=env)
        assert recorded.returncode == 0, recorded.stderr
    server = subprocess.Popen(
        [WIRETAPE, "serve", str(tape), "--listen", "127.0.0.1:0", "-q"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = server.stdout.readline().strip().removeprefix("http://")
        doctor = wiretape("doctor", "--listen", address, "--", *client, env=env)
        server.send_signal(signal.SIGTERM)
        served = server.wait(timeout=20)
    finally:
        server.kill()
        server.communicate()
    checks = [line for line in doctor.stdout.splitlines() if line[:4] in ("ok  ", "FAIL", "note")]
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert not [line for line in checks if line.startswith("FAIL")]
    assert f"CONNECT {authority}" in doctor.stdout
    assert any(line.startswith("ok    node ") for line in checks)
    assert any(line.startswith("ok    curl ") for line in checks)
    assert served == 0  # the doctor's command got its recorded answer: no divergence


def test_doctor_says_what_is_missing_and_exits_1(tmp_path, env):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    empty = {**env, "WIRETAPE_HOME": str(tmp_path / "home")}
    result = wiretape("doctor", "--listen", f"127.0.0.1:{dead}", "--", "true", env=empty)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"FAIL  proxy: nothing answers at 127.0.0.1:{dead}" in "\n".join(lines)
    assert any(line.startswith("ok    bundle: ") for line in lines)
    assert any(
        line.startswith("FAIL  true: none of its traffic went to the proxy") for line in lines
    )
    if shutil.which("node"):
        (node,) = [line for line in lines if " node " in line]
        if _node_fetches_through_proxies_itself():
            assert node.startswith("ok") and "fetch() through Node itself" in node
        else:
            assert node.startswith("FAIL") and "run `wiretape shims install node`" in node
    assert "Traceback" not in result.stderr


def _node_fetches_through_proxies_itself() -> bool:
    """With NODE_USE_ENV_PROXY=1: Node 24.0 and later, and 22.21 and later 22.x releases."""
    version = run(["node", "-p", "process.versions.node"], dict(os.environ)).stdout
    major, minor = (int(part) for part in version.split(".")[:2])
    return major >= 24 or (major == 22 and minor >= 21)


def test_go_is_recorded_in_base_url_mode_and_replayed(tmp_path, env, go_client):
    # Go never proxies loopback addresses, so a local upstream takes base-URL mode.
    command = lambda url: ["sh", "-c", 'exec "$0" "$WIRETAPE_BASE_URL"', go_client]  # noqa: E731
    recorded, _ = record_then_replay_offline(tmp_path, env, command, reverse=True)
    assert recorded.stdout.startswith("200 ") and "You said: Hello from Go" in recorded.stdout


def test_go_uses_https_proxy_and_trusts_wiretapes_ca(tmp_path, env, go_client):
    # A host that is not loopback, so Go uses HTTPS_PROXY; replay never resolves it.
    tape = tmp_path / "go.tape"
    body = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello from Go"}]}'
    headers = [("content-type", "application/json"), ("accept-encoding", "gzip")]
    request = Request(
        "POST", "https://api.example.test/v1/chat/completions", "HTTP/1.1", headers, body
    )
    answer = Response(200, "OK", "HTTP/1.1", [("content-type", "application/json")], b'{"ok":1}')
    with TapeWriter(tape, redaction={}) as writer:
        writer.append(Exchange(1, 0, request, answer))
    result = wiretape("replay", str(tape), "--", go_client, "https://api.example.test", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == '200 {"ok":1}\n'
    assert "no divergence" in result.stderr
