"""Run a recording proxy: an embedded mitmproxy master with the Recorder addon.

`RecordingProxy` starts on a running event loop, listens (port 0 by default), and stops
cleanly: servers closed first (mitmproxy's shutdown alone leaves the port open), in-flight
exchanges recorded as aborted, the tape sealed. One per process at a time: mitmproxy keeps
module-level context.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .recorder import ExchangeListener, Recorder
from .redact import Redactor
from .tapes import FsyncPolicy, TapeWriter


class RecordingError(Exception):
    """The proxy could not start: the message is one line for the user."""


@dataclass(slots=True)
class RecordingConfig:
    tape: Path
    home: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    reverse: str | None = None
    upstream_ca: Path | None = None
    upstream_insecure: bool = False
    redact: list[str] = field(default_factory=list)
    overwrite: bool = False
    fsync: FsyncPolicy = "batched"


class RecordingProxy:
    def __init__(
        self,
        config: RecordingConfig,
        redactor: Redactor,
        writer: TapeWriter,
        on_exchange: ExchangeListener | None = None,
    ) -> None:
        self.config = config
        self.recorder = Recorder(writer, redactor, on_exchange)
        self.writer = writer
        self.address: tuple[str, int] | None = None
        self._master = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        assert self.address is not None
        host, port = self.address
        return f"http://{host}:{port}"

    async def start(self) -> None:
        from mitmproxy import options
        from mitmproxy.addons import (
            core,
            disable_h2c,
            dns_resolver,
            next_layer,
            proxyserver,
            tlsconfig,
            update_alt_svc,
        )
        from mitmproxy.master import Master

        config = self.config
        opts = options.Options()
        master = Master(opts)
        # Only what recording needs: every addon is called on every hook of every flow.
        master.addons.add(
            core.Core(),
            disable_h2c.DisableH2C(),
            proxyserver.Proxyserver(),
            dns_resolver.DnsResolver(),
            next_layer.NextLayer(),
            tlsconfig.TlsConfig(),
            update_alt_svc.UpdateAltSvc(),
            self.recorder,
        )
        mode = f"reverse:{config.reverse}" if config.reverse else "regular"
        startup_errors = _ErrorCollector()
        logging.getLogger("mitmproxy").addHandler(startup_errors)
        try:
            opts.update(
                mode=[mode],
                listen_host=config.listen_host,
                listen_port=config.listen_port,
                confdir=str(config.home),
                # Connect upstream only once a request arrives, so a refused or failing
                # upstream is recorded as an exchange, not lost at CONNECT time.
                connection_strategy="lazy",
                ssl_insecure=config.upstream_insecure,
                ssl_verify_upstream_trusted_ca=_upstream_bundle(config),
            )
            self._master = master
            self._task = asyncio.create_task(master.run())
            ps = master.addons.get("proxyserver")
            while not ps.listen_addrs():
                if self._task.done() or startup_errors.messages:
                    break
                await asyncio.sleep(0.005)
        finally:
            logging.getLogger("mitmproxy").removeHandler(startup_errors)
        if not ps.listen_addrs():
            await self.stop()
            detail = startup_errors.messages[0] if startup_errors.messages else "unknown error"
            raise RecordingError(
                f"cannot listen on {config.listen_host}:{config.listen_port}: {detail}"
            )
        host, port, *_ = ps.listen_addrs()[0]
        self.address = (host, port)
        # mitmproxy leaves ~80k long-lived objects from start-up; every full collection
        # walked them all, a 100 ms pause each ~1,200 requests (the p99 at C=16).
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        """Close the listening socket, end the master, record what was in flight, seal."""
        master, task = self._master, self._task
        if master is None or task is None:
            return
        self._master = self._task = None
        try:
            ps = master.addons.get("proxyserver")
            await ps.servers.update([])
        finally:
            master.shutdown()
            try:
                await asyncio.wait_for(task, timeout=5)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            self.recorder.done()
            self.writer.close()


class _ErrorCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _upstream_bundle(config: RecordingConfig) -> str | None:
    """certifi's CAs plus `--upstream-ca`: mitmproxy trusts only the one file it is given."""
    if config.upstream_ca is None:
        return None
    import certifi
    from blake3 import blake3

    data = Path(certifi.where()).read_bytes() + b"\n" + config.upstream_ca.read_bytes()
    # Named by content, so concurrent recorders with the same CA share one file safely.
    bundle = config.home / f"upstream-ca-{blake3(data).hexdigest()[:16]}.pem"
    if not bundle.exists():
        temporary = bundle.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, bundle)
    return str(bundle)
