"""The fake upstream and the proxies in front of it, started together, each reachable as a Target.

The upstream speaks TLS (agents talk HTTPS). Proxy-mode clients tunnel through `CONNECT`
and trust the proxy's CA; base-URL-mode clients speak plain HTTP to the proxy, which speaks
TLS to the upstream. Each recorder has a WIRETAPE_HOME of its own (two starting at once in
one home would race to create the CA), and each mitmdump a confdir of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from wiretape.tapes import TapeError, verify_tape

from .load import Target, client_context
from .services import (
    Service,
    recorder_address,
    start_fake_upstream,
    start_mitmdump,
    start_recorder,
)

__all__ = ["Lab", "TapeCheck"]

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
