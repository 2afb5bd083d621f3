"""`wiretape demo`: record a bundled agent against a bundled fake LLM, replay it offline, and
show what a divergence report says. Needs no key and no network."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WIRETAPE = [sys.executable, "-m", "wiretape"]
AGENT = [sys.executable, "-m", "wiretape.example_agent"]
STEP_TIMEOUT = 120


def run_demo() -> int:
    with tempfile.TemporaryDirectory(prefix="wiretape-demo-") as scratch:
        work = Path(scratch)
        env = _environment(work)
        tape = work / "agent.tape"
        upstream, url, ca = _start_upstream(env)
        agent = [*AGENT, "--base-url", f"{url}/v1"]
        try:
            _step(
                1,
                "Record",
                f"""The bundled agent asks a tool-using question and streams the answer. Its
                model API here is wiretape's fake LLM upstream at {url}, speaking the real
                OpenAI wire format over TLS. `wiretape record` runs the agent through the
                proxy; each exchange is printed as it is written to the tape.""",
            )
            _show(
                [*WIRETAPE, "record", str(tape), "--upstream-ca", ca, "--", *agent], env, expect=0
            )
            _step(2, "Verify and inspect", "The tape is sealed, hash-chained and secret-free.")
            _show([*WIRETAPE, "verify", "--secrets", str(tape)], env, expect=0)
            _show([*WIRETAPE, "inspect", str(tape)], env, expect=0)
            print("\nThe API key the agent sent never reached the tape:")
            key = env["OPENAI_API_KEY"]
            print(f"  {key[:12]}… found on the tape: {key.encode() in tape.read_bytes()}")
        finally:
            _stop(upstream)
        _step(
            3,
            "Replay offline",
            """The fake upstream is now stopped: nothing answers at its address. `wiretape
            replay` serves the tape instead, byte for byte, SSE chunks and all. Same agent,
            same output, exit code 0.""",
        )
        _show([*WIRETAPE, "replay", str(tape), "--", *agent], env, expect=0)
        _step(
            4,
            "Change the prompt, see the divergence",
            """Someone edits the agent's system prompt. Replaying the old tape now fails with
            exit code 1, and the report names the request and the field that changed.""",
        )
        changed = [*agent, "--system-prompt", "You are a verbose travel assistant."]
        report = work / "report.json"
        _show([*WIRETAPE, "replay", str(tape), "--report", str(report), "--", *changed], env, 1)
        print(f"\nThe same report as JSON (--report) has {len(report.read_text())} bytes.")
        _step(
            5,
            "Done",
            """In your project: `wiretape record tapes/run.tape -- python agent.py`, commit the
            tape, and in CI: `wiretape replay tapes/run.tape -- pytest`.""",
        )
    return 0


def _environment(work: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k.upper() not in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
    }
    env["WIRETAPE_HOME"] = str(work / "home")  # a CA and key of its own, removed afterwards
    env["OPENAI_API_KEY"] = "sk-proj-DEMOkeyDEMOkeyDEMOkeyDEMOkey0123456789"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start_upstream(env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "wiretape.fake_upstream", "--tls"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().split()[-1]
    ca = process.stdout.readline().split()[-1]
    return process, url, ca


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def _step(number: int, title: str, text: str) -> None:
    print(
        f"\n\033[1m== {number}. {title}\033[0m"
        if sys.stdout.isatty()
        else f"\n== {number}. {title}"
    )
    print(textwrap.fill(" ".join(textwrap.dedent(text).split()), width=88))


def _show(command: list[str], env: dict[str, str], expect: int) -> None:
    shown = shlex.join(["wiretape", *command[3:]]).replace(sys.executable, "python")
    print(f"\n$ {shown}", flush=True)
    result = subprocess.run(command, env=env, timeout=STEP_TIMEOUT, stderr=subprocess.STDOUT)
    print(f"(exit code {result.returncode})", flush=True)
    if result.returncode != expect:
        raise SystemExit(f"demo: expected exit code {expect}, got {result.returncode}")
