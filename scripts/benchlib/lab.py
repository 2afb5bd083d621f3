"""The fake upstream and what sits in front of it, each reachable as a Target.

`Lab` starts the recorders (`wiretape record`, `mitmdump -w`) together; `ReplayLab` records
traffic once and then starts the replayers (`wiretape serve`, `mitmdump --server-replay`,
VCR.py). The upstream speaks TLS (agents talk HTTPS). Proxy-mode clients tunnel through
`CONNECT` and trust the proxy's CA; base-URL-mode clients speak plain HTTP to the proxy, which
speaks TLS to the upstream (a replayer answers itself). Each recorder has a WIRETAPE_HOME of
its own (two starting at once in one home would race to create the CA), and each mitmdump a
confdir of its own.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from wiretape.tapes import TapeError, verify_tape

from .load import Target, client_context, dial, drive
from .services import (
    InProcessClient,
    Service,
    ServiceError,
    recorder_address,
    replay_address,
    start_fake_upstream,
    start_mitmdump,
    start_mitmdump_replay,
    start_recorder,
    start_replay_server,
    upstream_requests,
)

__all__ = ["Lab", "Recorded", "ReplayLab", "TapeCheck"]

RECORDERS = ("record-proxy", "record-reverse")
MITMDUMPS = ("mitmdump-proxy", "mitmdump-reverse")


@dataclass(slots=True)
class TapeCheck:
    """What a recorder left behind once stopped."""

    exchanges: int | None  # None when the tape did not verify
    problem: str | None
    exit_code: int | None


class Lab:
    """Start with `with Lab(workdir, mitmdump=True) as lab:`; `lab.targets[mode]` to reach one."""

    def __init__(self, workdir: Path, *, mitmdump: bool) -> None:
        self.workdir = workdir
        self.with_mitmdump = mitmdump
        self.services: dict[str, Service] = {}
        self.targets: dict[str, Target] = {}
        self.exit_codes: dict[str, int | None] = {}

    def __enter__(self) -> Lab:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start(self) -> None:
        work = self.workdir
        upstream, url, ca = start_fake_upstream(work)
        self.services["upstream"] = upstream
        split = urlsplit(url)
        assert split.hostname is not None and split.port is not None
        origin = (split.hostname, split.port)
        self.targets["direct"] = Target("direct", origin, origin, client_context(ca))

        # Started together (each spends about a second importing mitmproxy), then awaited.
        for mode in RECORDERS:
            reverse = url if mode == "record-reverse" else None
            self.services[mode] = start_recorder(
                mode, work / f"{mode}.tape", work / f"home-{mode}", ca, reverse
            )
        ports = {}
        if self.with_mitmdump:
            for mode in MITMDUMPS:
                reverse = url if mode == "mitmdump-reverse" else None
                service, ports[mode] = start_mitmdump(
                    mode, work / f"{mode}.flows", work / f"conf-{mode}", ca, reverse
                )
                self.services[mode] = service

        for mode in RECORDERS:
            service = self.services[mode]
            address = recorder_address(service)
            if mode == "record-proxy":
                trust = client_context(str(work / f"home-{mode}" / "mitmproxy-ca-cert.pem"))
                self.targets[mode] = Target(mode, address, origin, trust, True, service.pid)
            else:
                self.targets[mode] = Target(mode, address, origin, None, False, service.pid)
        for mode, port in ports.items():
            service = self.services[mode]
            service.wait_for_port(port)
            address = ("127.0.0.1", port)
            if mode == "mitmdump-proxy":
                trust = client_context(str(work / f"conf-{mode}" / "mitmproxy-ca-cert.pem"))
                self.targets[mode] = Target(mode, address, origin, trust, True, service.pid)
            else:
                self.targets[mode] = Target(mode, address, origin, None, False, service.pid)

    @property
    def upstream(self) -> Service:
        return self.services["upstream"]

    def stop(self) -> None:
        """Stop the proxies, then the upstream (so the proxies see no upstream failures)."""
        for name in [*RECORDERS, *MITMDUMPS, "upstream"]:
            service = self.services.get(name)
            if service is not None and name not in self.exit_codes:
                self.exit_codes[name] = service.stop()

    def tape_check(self, mode: str) -> TapeCheck:
        """Verify a stopped recorder's tape: sealed, chain intact, how many exchanges."""
        code = self.exit_codes.get(mode)
        try:
            summary = verify_tape(self.workdir / f"{mode}.tape")
        except (TapeError, OSError) as exc:
            return TapeCheck(None, str(exc), code)
        return TapeCheck(summary.exchanges, None, code)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request the replay lab records before anything is replayed."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[str, ...] = ()


class ReplayLab:
    """The fake upstream, the traffic recorded from it, and the replayers started on it.

    On entering, the lab starts the upstream and records each of `recorded` once through
    `wiretape record` (proxy mode) into one tape, the first also through `mitmdump -w` (for
    `--server-replay`) and VCR.py (a cassette). The recorders are then stopped; the upstream
    keeps running, so that `upstream_requests()` can show that no replayer ever reached it.
    Replayers started with `serve`, `mitmdump` and `in_process` are stopped by `stop_started`
    (or on leaving).
    """

    def __init__(self, workdir: Path, recorded: list[Recorded]) -> None:
        self.workdir = workdir
        self.recorded = recorded
        self.home = workdir / "home"
        self.confdir = workdir / "conf-mitmdump"
        self.tape = workdir / "recorded.tape"
        self.flows = workdir / "recorded.flows"
        self.cassette = workdir / "recorded-cassette.yaml"
        self.body_file = workdir / "recorded-body.bin"
        self.upstream: Service = None  # type: ignore[assignment]
        self.url = ""
        self.ca = ""
        self.origin: tuple[str, int] = ("", 0)
        self.started: dict[str, Service | InProcessClient] = {}
        self.exit_codes: dict[str, int | None] = {}
        self.recorded_requests = 0  # what the upstream had read once recording was done

    def __enter__(self) -> ReplayLab:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.upstream, self.url, self.ca = start_fake_upstream(self.workdir)
            split = urlsplit(self.url)
            assert split.hostname is not None and split.port is not None
            self.origin = (split.hostname, split.port)
            self._record()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop_started()
        if self.upstream is not None:
            self.upstream.stop()

    @property
    def direct(self) -> Target:
        return Target("direct", self.origin, self.origin, client_context(self.ca))

    def upstream_requests(self) -> int:
        return upstream_requests(self.upstream)

    def _record(self) -> None:
        recorder = start_recorder("recorder", self.tape, self.home, self.ca)
        mitmdump, port = start_mitmdump(
            "mitmdump-recorder", self.flows, self.confdir, self.ca, reverse=None
        )
        first = self.recorded[0]
        self.body_file.write_bytes(first.body)
        cassette = InProcessClient(
            "vcr-recorder", "record", self.url + first.path, self.ca, self.body_file, self.cassette
        )
        try:
            address = recorder_address(recorder)
            through = Target("recorder", address, self.origin, self.proxy_trust(), True)
            self._send(through, self.recorded)
            mitmdump.wait_for_port(port)
            trust = client_context(str(self.confdir / "mitmproxy-ca-cert.pem"))
            through = Target("mitmdump-recorder", ("127.0.0.1", port), self.origin, trust, True)
            self._send(through, self.recorded[:1])
            cassette.ready()
        finally:
            codes = [recorder.stop(), mitmdump.stop(), cassette.stop()]
        if codes != [0, 0, 0]:
            raise ServiceError(f"recording failed: exit codes {codes} (recorder, mitmdump, VCR)")
        summary = verify_tape(self.tape)
        if summary.exchanges != len(self.recorded):
            raise ServiceError(f"{self.tape}: {summary.exchanges} exchanges recorded")
        self.recorded_requests = self.upstream_requests()

    @staticmethod
    def _send(target: Target, recorded: list[Recorded]) -> None:
        connection = dial(target)
        try:
            for item in recorded:
                request = target.request(item.method, item.path, item.body, item.headers)
                drive([connection], request, 0)
        finally:
            connection.close()

    def serve(
        self,
        name: str,
        *,
        reverse: bool,
        pace: str = "fast",
        cpus: Iterable[int] | None = None,
    ) -> Target:
        """`wiretape serve` on the recorded tape, reached in proxy mode (CONNECT, TLS from
        wiretape's CA) or, with `reverse`, in base-URL mode (plain HTTP)."""
        service = start_replay_server(
            name,
            self.tape,
            self.home,
            reverse=self.url if reverse else None,
            pace=pace,
            report=self.workdir / f"{name}.report.json",
            cpus=cpus,
        )
        self.started[name] = service
        address = replay_address(service)
        if reverse:
            return Target(name, address, self.origin, None, False, service.pid)
        return Target(name, address, self.origin, self.proxy_trust(), True, service.pid)

    def proxy_trust(self) -> ssl.SSLContext:
        """A client context trusting wiretape's CA, which replay's tunnels are certified by."""
        return client_context(str(self.home / "mitmproxy-ca-cert.pem"))

    def mitmdump(
        self, name: str, *, reverse: bool, cpus: Iterable[int] | None = None
    ) -> Callable[[], Target]:
        """Start `mitmdump --server-replay` on the recorded flows; the function returned
        waits until it listens (it imports for about a second) and gives its target."""
        service, port = start_mitmdump_replay(
            name, self.flows, self.confdir, self.ca, self.url if reverse else None, cpus
        )
        self.started[name] = service

        def target() -> Target:
            service.wait_for_port(port)
            address = ("127.0.0.1", port)
            if reverse:
                return Target(name, address, self.origin, None, False, service.pid)
            trust = client_context(str(self.confdir / "mitmproxy-ca-cert.pem"))
            return Target(name, address, self.origin, trust, True, service.pid)

        return target

    def in_process(self, name: str, mode: str) -> InProcessClient:
        """httpx in a process of its own: `direct` to the upstream, or `replay` by VCR.py."""
        url = self.url + self.recorded[0].path
        client = InProcessClient(name, mode, url, self.ca, self.body_file, self.cassette)
        self.started[name] = client
        return client

    def stop_started(self) -> None:
        for name, service in list(self.started.items()):
            self.exit_codes[name] = service.stop()
        self.started.clear()

    def report(self, name: str) -> dict | None:
        """The divergence report `wiretape serve` wrote when stopped, as JSON."""
        path = self.workdir / f"{name}.report.json"
        return json.loads(path.read_text()) if path.exists() else None
