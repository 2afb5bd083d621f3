"""The processes a benchmark measures: the fake upstream, `wiretape record`, `mitmdump -w`.

Each runs as a subprocess of its own, so its CPU is its own (read from /proc) and apart from
the load client's. Output goes to a log file, never a pipe nobody drains. Every process is
stopped by its pid: SIGTERM, a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "Service",
    "ServiceError",
    "free_port",
    "recorder_address",
    "start_fake_upstream",
    "start_mitmdump",
    "start_recorder",
]

START_TIMEOUT = 30.0  # mitmproxy imports in about a second; a busy box takes longer
STOP_TIMEOUT = 10.0
BIN = Path(sys.executable).parent


class ServiceError(Exception):
    """A process did not start; the message names it and quotes its log."""


class Service:
    """A subprocess the benchmark started, with its output in `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
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


def start_fake_upstream(workdir: Path) -> tuple[Service, str, str]:
    """The fake LLM upstream over TLS: the service, its URL and its CA's path."""
    service = Service(
        "fake upstream",
        [
            sys.executable,
            "-m",
            "wiretape.fake_upstream",
            "--tls",
            "--cert-dir",
            str(workdir / "upstream-certs"),
        ],
        workdir / "upstream.log",
        dict(os.environ),
    )
    ca = service.wait_for(r"^ca (\S+)$").group(1)
    url = service.wait_for(r"^listening on (\S+)$").group(1)
    return service, url, ca


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
