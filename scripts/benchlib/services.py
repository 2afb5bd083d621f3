"""The processes a benchmark measures: the fake upstream, `wiretape record` and `serve`,
`mitmdump -w` and `mitmdump --server-replay`.

Each runs as a subprocess of its own, so its CPU is its own (read from /proc) and apart from
the load client's. Output goes to a log file, never a pipe nobody drains. Every process is
stopped by its pid: SIGTERM, a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "InProcessClient",
    "Service",
    "ServiceError",
    "free_port",
    "pin",
    "recorder_address",
    "replay_address",
    "start_bare_server",
    "start_fake_upstream",
    "start_mitmdump",
    "start_mitmdump_replay",
    "start_recorder",
    "start_replay_server",
    "upstream_requests",
]

START_TIMEOUT = 30.0  # mitmproxy imports in about a second; a busy box takes longer
STOP_TIMEOUT = 10.0
BIN = Path(sys.executable).parent


class ServiceError(Exception):
    """A process did not start; the message names it and quotes its log."""


class Service:
    """A subprocess the benchmark started, with its output in `log`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str],
        cpus: Iterable[int] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        if cpus is not None:
            argv = [*pinned(cpus), *argv]
        with log.open("wb") as output:
            # A session of its own: a Ctrl-C at the terminal reaches the bench, which then
            # stops this process in order, instead of every process at once.
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pid = self.process.pid

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match[str]:
        """The first match of `pattern` in the log, once the process has written it."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern, re.MULTILINE)
        while True:
            match = regex.search(self.log.read_text(errors="replace"))
            if match:
                return match
            self._check_running(deadline, f"to print {pattern!r}")
            time.sleep(0.02)

    def wait_for_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                self._check_running(deadline, f"to listen on port {port}")
                time.sleep(0.05)

    def _check_running(self, deadline: float, what: str) -> None:
        if self.process.poll() is not None:
            raise ServiceError(
                f"{self.name} exited with {self.process.returncode}: {self._log_tail()}"
            )
        if time.monotonic() > deadline:
            raise ServiceError(f"{self.name} took too long {what}: {self._log_tail()}")

    def _log_tail(self) -> str:
        text = self.log.read_text(errors="replace").strip()
        return text[-600:] or "(no output)"

    def rss_mb(self) -> float:
        """Resident memory now, in MB."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not end in time; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        return self.process.returncode


def free_port() -> int:
    """A port free now (for mitmdump, which does not report a port it picked itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pinned(cpus: Iterable[int]) -> list[str]:
    """The argv prefix that runs a command (and every thread it starts) on `cpus` only."""
    listed = ",".join(str(cpu) for cpu in sorted(cpus))
    if shutil.which("taskset") is None:
        raise ServiceError("taskset (util-linux) is needed to pin a process to a core")
    return ["taskset", "-c", listed]


def pin(pid: int, cpus: Iterable[int]) -> None:
    """Move every thread of running process `pid` onto `cpus`."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), set(cpus))


def start_fake_upstream(workdir: Path) -> tuple[Service, str, str]:
    """The fake LLM upstream over TLS (benchlib/upstream.py): the service, its URL and its
    CA's path. `upstream_requests` asks it how many requests it has read."""
    service = Service(
        "fake upstream",
        [
            sys.executable,
            str(Path(__file__).with_name("upstream.py")),
            "--cert-dir",
            str(workdir / "upstream-certs"),
        ],
        workdir / "upstream.log",
        dict(os.environ),
    )
    ca = service.wait_for(r"^ca (\S+)$").group(1)
    url = service.wait_for(r"^listening on (\S+)$").group(1)
    return service, url, ca


def upstream_requests(service: Service, timeout: float = 5.0) -> int:
    """How many requests the fake upstream has read since it started."""
    pattern = re.compile(r"^requests (\d+)$", re.MULTILINE)
    before = len(pattern.findall(service.log.read_text(errors="replace")))
    service.process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while True:
        counts = pattern.findall(service.log.read_text(errors="replace"))
        if len(counts) > before:
            return int(counts[-1])
        service._check_running(deadline, "to print its request count")
        time.sleep(0.002)


def start_recorder(
    name: str, tape: Path, home: Path, upstream_ca: str, reverse: str | None = None
) -> Service:
    """`wiretape record TAPE` with its own WIRETAPE_HOME; call `recorder_url` once started."""
    argv = [str(BIN / "wiretape"), "record", str(tape), "--upstream-ca", upstream_ca, "--quiet"]
    if reverse is not None:
        argv += ["--reverse", reverse]
    env = dict(os.environ, WIRETAPE_HOME=str(home))
    return Service(name, argv, tape.with_suffix(".log"), env)


def recorder_address(service: Service) -> tuple[str, int]:
    match = service.wait_for(r"listening on http://([\d.]+):(\d+)")
    return match.group(1), int(match.group(2))


def start_mitmdump(
    name: str, flows: Path, confdir: Path, upstream_ca: str, reverse: str | None = None
) -> tuple[Service, int]:
    """Bare `mitmdump -w FLOWS` on a free port; mitmproxy's CA is created in `confdir`.

    `connection_strategy=lazy` matches the recorder's, so both connect upstream on the first
    request rather than at CONNECT time.
    """
    port = free_port()
    argv = [
        str(BIN / "mitmdump"),
        "-q",
        "-w",
        str(flows),
        "--listen-host",
        "127.0.0.1",
        "-p",
        str(port),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"ssl_verify_upstream_trusted_ca={upstream_ca}",
        "--set",
        "connection_strategy=lazy",
    ]
    if reverse is not None:
        argv += ["--mode", f"reverse:{reverse}"]
    return Service(name, argv, flows.with_suffix(".log"), dict(os.environ)), port


def start_replay_server(
    name: str,
    tape: Path,
    home: Path,
    *,
    reverse: str | None = None,
    pace: str = "fast",
    report: Path | None = None,
    cpus: Iterable[int] | None = None,
    port: int = 0,
    env: dict[str, str] | None = None,
) -> Service:
    """`wiretape serve TAPE --allow-repeats --quiet`; call `replay_address` once started.

    `home` is the WIRETAPE_HOME the tape was recorded with: the same CA for proxy-mode
    clients, the same redaction key. `env` replaces this process's environment.
    """
    argv = [str(BIN / "wiretape"), "serve", str(tape), "--listen", f"127.0.0.1:{port}"]
    argv += ["--allow-repeats", "--quiet", "--pace", pace]
    if reverse is not None:
        argv += ["--reverse", reverse]
    if report is not None:
        argv += ["--report", str(report)]
    env = dict(os.environ if env is None else env, WIRETAPE_HOME=str(home))
    return Service(name, argv, tape.parent / f"{name}.log", env, cpus)


def replay_address(service: Service) -> tuple[str, int]:
    """Where `wiretape serve` (or the bare server) listens: the first line it prints."""
    match = service.wait_for(r"^http://([\d.]+):(\d+)$")
    return match.group(1), int(match.group(2))


def start_mitmdump_replay(
    name: str,
    flows: Path,
    confdir: Path,
    upstream_ca: str,
    reverse: str | None = None,
    cpus: Iterable[int] | None = None,
) -> tuple[Service, int]:
    """`mitmdump --server-replay FLOWS` on a free port, set up to never go upstream.

    Every request is answered from the flows again and again (`server_replay_reuse`), one
    with no recording is killed rather than forwarded (`server_replay_extra=kill`), and the
    lazy connection strategy keeps even a CONNECT from opening an upstream connection.
    `server_replay_refresh` is off: rewriting date headers is work wiretape does not do.
    """
    port = free_port()
    argv = [
        str(BIN / "mitmdump"),
        "-q",
        "--listen-host",
        "127.0.0.1",
        "-p",
        str(port),
        "--server-replay",
        str(flows),
        "--set",
        "server_replay_reuse=true",
        "--set",
        "server_replay_extra=kill",
        "--set",
        "server_replay_refresh=false",
        "--set",
        "connection_strategy=lazy",
        "--set",
        f"confdir={confdir}",
        "--set",
        f"ssl_verify_upstream_trusted_ca={upstream_ca}",
    ]
    if reverse is not None:
        argv += ["--mode", f"reverse:{reverse}"]
    service = Service(name, argv, flows.parent / f"{name}.log", dict(os.environ), cpus)
    return service, port


class InProcessClient:
    """benchlib/vcr_client.py as a subprocess: httpx going direct, or replayed by VCR.py.

    `window(c, seconds)` runs one load window there and returns what it measured; the
    process's CPU covers the client and, in replay mode, VCR.py: there is no other process.
    """

    def __init__(
        self, name: str, mode: str, url: str, ca: str, body_file: Path, cassette: Path
    ) -> None:
        self.name = name
        self.log = cassette.parent / f"{name}.log"
        argv = [
            sys.executable,
            str(Path(__file__).with_name("vcr_client.py")),
            "--mode",
            mode,
            "--url",
            url,
            "--ca",
            ca,
            "--body-file",
            str(body_file),
            "--cassette",
            str(cassette),
        ]
        with self.log.open("wb") as errors:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                start_new_session=True,
            )
        self.pid = self.process.pid
        self.mode = mode

    def ready(self) -> None:
        """Wait until it is set up (record mode: until it has written the cassette)."""
        if self.mode == "record":
            if self.process.wait(START_TIMEOUT) != 0:
                raise ServiceError(f"{self.name} failed: {self._log_tail()}")
            return
        self._read()

    def window(self, c: int, seconds: float) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"c": c, "seconds": seconds}).encode() + b"\n")
        self.process.stdin.flush()
        result = self._read()
        if result["failures"]:
            raise ServiceError(f"{self.name}: {result['failures']}")
        return result

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(STOP_TIMEOUT)
            raise ServiceError(
                f"{self.name} exited with {self.process.returncode}: {self._log_tail()}"
            )
        return json.loads(line)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace").strip()[-600:] or "(no output)"

    def stop(self) -> int | None:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                assert self.process.stdin is not None
                self.process.stdin.write(b'{"quit": true}\n')
                self.process.stdin.close()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return self.process.returncode


def start_bare_server(
    name: str, workdir: Path, body_file: Path | None, cpus: Iterable[int] | None = None
) -> Service:
    """benchlib/bare_server.py: asyncio and httptools answering `body_file` to every request,
    or, with no body, a TCP echo server. Its URL is the first line it prints."""
    argv = [sys.executable, str(Path(__file__).with_name("bare_server.py"))]
    argv += ["--echo"] if body_file is None else ["--body-file", str(body_file)]
    return Service(name, argv, workdir / f"{name}.log", dict(os.environ), cpus)
