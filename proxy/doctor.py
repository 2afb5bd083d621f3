"""`wiretape doctor`: can the clients on this machine reach a running wiretape and trust it?

One plain line per check, each saying what is missing and what to do about it. Trust is
tested, not assumed: a throwaway TLS server on loopback presents a certificate issued by
wiretape's CA (as the recorder and the replay server do), and each runtime found on PATH
(python3, node, curl) connects to it with the variables `wiretape env` sets. With a command,
the command runs with those variables pointed at a relay in front of the proxy, so doctor can
say which of its connections went through the proxy at all.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .client_shims.environment import PROXY_VARIABLES, client_environment
from .client_shims.installs import INSTALL_COMMAND, node_modules_dir

__all__ = ["Check", "run_doctor"]

OK, FAIL, NOTE = "ok", "FAIL", "note"
RUNTIME_TIMEOUT = 30  # seconds for one runtime's check; node and python start in well under 1
ALL_PROXY_VARIABLES = (*PROXY_VARIABLES, "ALL_PROXY", "all_proxy")


@dataclass(frozen=True, slots=True)
class Check:
    status: str  # OK, FAIL, or NOTE (worth knowing, not a failure)
    subject: str
    detail: str

    def to_text(self) -> str:
        return f"{self.status:<4}  {self.subject}: {self.detail}"


def run_doctor(
    host: str, port: int, home: Path, command: list[str], out: Callable[[str], None] = print
) -> int:
    """Print one line per check as it completes; 0 when nothing failed, else 1."""
    failed = False
    for check in _checks(host, port, home, command):
        out(check.to_text())
        failed = failed or check.status == FAIL
    return 1 if failed else 0


def _checks(host: str, port: int, home: Path, command: list[str]) -> Iterator[Check]:
    address = f"{_url_host(host)}:{port}"
    proxy_url = f"http://{address}"
    yield from _ca_checks(home)
    yield _proxy_check(host, port, address)
    env = client_environment(proxy_url, None, home, base=os.environ)
    with _TrustServer(home) as server:
        yield _python_check(server.url, {**os.environ, **env})
        yield _node_check(server.url, {**os.environ, **env}, home)
        yield _curl_check(server.url, {**_unproxied(os.environ), **_unproxied(env)})
    yield _shell_check(proxy_url, address)
    if command:
        yield from _command_checks(command, host, port, address, home)


def _ca_checks(home: Path) -> Iterator[Check]:
    from .home import ca_bundle_path, ca_cert_path, system_ca_file

    cert = ca_cert_path(home)
    yield Check(OK, "CA", f"wiretape's CA certificate is {cert}")
    bundle = ca_bundle_path(home)
    pem = bundle.read_bytes()
    others = pem.count(b"-----BEGIN CERTIFICATE-----") - 1
    if cert.read_bytes().strip() not in pem:
        yield Check(FAIL, "bundle", f"{bundle} does not hold wiretape's CA: delete it to rebuild")
    elif others < 1:
        yield Check(
            FAIL,
            "bundle",
            f"{bundle} holds only wiretape's CA, so clients given it would distrust every "
            "other site: set WIRETAPE_SYSTEM_CA to the system's CA bundle file",
        )
    else:
        yield Check(
            OK,
            "bundle",
            f"{bundle} holds wiretape's CA and {others} system CAs from {system_ca_file()}",
        )


def _proxy_check(host: str, port: int, address: str) -> Check:
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        return Check(
            FAIL,
            "proxy",
            f"nothing answers at {address} ({exc.strerror or exc}): start "
            f"`wiretape record TAPE --listen {address}` or `wiretape serve TAPE --listen "
            f"{address}`, or give doctor the --listen that wiretape uses",
        )
    return Check(OK, "proxy", f"something listens at {address} (a wiretape record or serve)")


# Runs in the user's python3 (any 3.8+): which of its HTTP stacks trust the test server.
_PYTHON_PROBE = """
import json, os, sys, urllib.request
shim = any(type(f).__name__ == "WiretapeImportHook" for f in sys.meta_path)
for name in PROXY_VARIABLES:
    os.environ.pop(name, None)
url, results = sys.argv[1], {}
try:
    urllib.request.urlopen(url, timeout=10).read()
    results["ssl (SSL_CERT_FILE)"] = "ok"
except Exception as exc:
    results["ssl (SSL_CERT_FILE)"] = str(getattr(exc, "reason", exc))
for name, via in (("httpx", ""), ("requests", " (REQUESTS_CA_BUNDLE)")):
    try:
        module = __import__(name)
    except ImportError:
        continue
    try:
        module.get(url, timeout=10).raise_for_status()
        results[name + via] = "ok"
    except Exception as exc:
        results[name + via] = str(exc)[:300]
print(json.dumps({"version": sys.version.split()[0], "shim": shim, "results": results}))
""".replace("PROXY_VARIABLES", repr(ALL_PROXY_VARIABLES))


def _python_check(url: str, env: dict[str, str]) -> Check:
    python = shutil.which("python3", path=env.get("PATH"))
    if python is None:
        return Check(NOTE, "python3", "not found on PATH, not checked")
    probe = _run([python, "-c", _PYTHON_PROBE, url], env)
    if isinstance(probe, str):
        return Check(FAIL, "python3", f"{python}: {probe}")
    name = f"python3 {probe['version']} ({python})"
    distrust = [f"{lib}: {why}" for lib, why in probe["results"].items() if why != "ok"]
    if distrust:
        return Check(FAIL, name, "does not trust wiretape's CA through " + "; ".join(distrust))
    trusted = "trusts wiretape's CA through " + ", ".join(probe["results"])
    if not probe["shim"]:
        return Check(
            FAIL,
            name,
            f"{trusted}, but the sitecustomize shim did not load "
            "(is PYTHONPATH passed on?), so aiohttp would ignore the proxy",
        )
    return Check(OK, name, f"{trusted}; the aiohttp shim loads")


# Runs in the user's node: what the preload routes, and whether node trusts the test server.
_NODE_PROBE = """
const https = require('https');
const state = {
  version: process.versions.node,
  routes: globalThis[Symbol.for('wiretape.preload')] || null,
};
const done = (trust) => { state.trust = trust; console.log(JSON.stringify(state)); };
https.get(process.argv[1], { agent: new https.Agent() }, (response) => {
  response.resume();
  response.on('end', () => done('ok'));
}).on('error', (error) => done(error.code || error.message));
"""


def _node_check(url: str, env: dict[str, str], home: Path) -> Check:
    node = shutil.which("node", path=env.get("PATH"))
    if node is None:
        return Check(NOTE, "node", "not found on PATH, not checked")
    probe = _run([node, "-e", _NODE_PROBE, url], env)
    if isinstance(probe, str):
        return Check(FAIL, "node", f"{node}: {probe}")
    name = f"node {probe['version']} ({node})"
    routes = probe["routes"]
    if probe["trust"] != "ok":
        return Check(
            FAIL, name, f"does not trust wiretape's CA (NODE_EXTRA_CA_CERTS): {probe['trust']}"
        )
    if not routes:
        return Check(
            FAIL, name, "trusts wiretape's CA, but the preload did not load (NODE_OPTIONS)"
        )
    if not routes["fetch"]:
        return Check(
            FAIL,
            name,
            f"trusts wiretape's CA, but fetch() would ignore the proxy: run `{INSTALL_COMMAND}` "
            f"(no undici in {node_modules_dir(home)})",
        )
    via = {"node": "Node itself", "tunnel": "the preload"}
    return Check(
        OK,
        name,
        "trusts wiretape's CA (NODE_EXTRA_CA_CERTS); proxy used by fetch() through "
        f"{via.get(routes['fetch'], routes['fetch'])} and by http/https through "
        f"{via.get(routes['https'], routes['https'])}",
    )


def _curl_check(url: str, env: dict[str, str]) -> Check:
    curl = shutil.which("curl", path=env.get("PATH"))
    if curl is None:
        return Check(NOTE, "curl", "not found on PATH, not checked")
    try:
        done = subprocess.run(
            [curl, "-sS", "-o", os.devnull, url],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUNTIME_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return Check(FAIL, "curl", f"{curl}: no answer in {RUNTIME_TIMEOUT} s")
    if done.returncode != 0:
        return Check(FAIL, f"curl ({curl})", f"does not trust wiretape's CA: {done.stderr.strip()}")
    return Check(OK, f"curl ({curl})", "trusts wiretape's CA (CURL_CA_BUNDLE)")


def _shell_check(proxy_url: str, address: str) -> Check:
    if os.environ.get("HTTPS_PROXY") == proxy_url and os.environ.get("http_proxy") == proxy_url:
        return Check(OK, "this shell", f"routes its processes through {proxy_url}")
    return Check(
        NOTE,
        "this shell",
        f'is not routed through {proxy_url}: eval "$(wiretape env --listen {address})", '
        "or run the agent as `wiretape record TAPE -- COMMAND`",
    )


def _command_checks(
    command: list[str], host: str, port: int, address: str, home: Path
) -> Iterator[Check]:
    with _Relay((host, port)) as relay:
        env = {**os.environ, **client_environment(relay.url, None, home, base=os.environ)}
        code = subprocess.run(command, env=env).returncode
    name = command[0]
    if not relay.requests:
        yield Check(
            FAIL,
            name,
            "none of its traffic went to the proxy: it ignores HTTPS_PROXY (or NO_PROXY "
            "covers its hosts); give it a base URL instead (wiretape record --reverse URL)",
        )
    elif relay.unreachable:
        yield Check(
            FAIL,
            name,
            f"made {len(relay.requests)} connection(s) to the proxy, but nothing answers at "
            f"{address}",
        )
    else:
        seen = ", ".join(
            f"{line} (x{count})" if count > 1 else line
            for line, count in Counter(relay.requests).items()
        )
        yield Check(OK, name, f"{len(relay.requests)} connection(s) went through the proxy: {seen}")
    if code != 0:
        yield Check(FAIL, name, f"exited with {code} (its own output is above)")


def _run(args: list[str], env: dict[str, str]) -> dict | str:
    """A probe's one JSON line, or what went wrong."""
    try:
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=RUNTIME_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {RUNTIME_TIMEOUT} s"
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        error = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"the check did not run: {error}"


def _unproxied(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ALL_PROXY_VARIABLES}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _Background(socketserver.ThreadingTCPServer):
    """A loopback server on port 0, serving in a thread for as long as the `with` lasts."""

    daemon_threads = True

    def __init__(self, handler: type[socketserver.BaseRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


class _TrustServer(_Background):
    """HTTPS on loopback with a certificate from wiretape's CA: a client that trusts the CA
    gets a 200, any other fails its handshake."""

    def __init__(self, home: Path) -> None:
        from .certificates import LeafIssuer

        self.context = LeafIssuer(home).context_for("127.0.0.1")
        super().__init__(_TrustHandler)

    @property
    def url(self) -> str:
        return f"https://{self.address}/"


class _TrustHandler(socketserver.BaseRequestHandler):
    server: _TrustServer

    def handle(self) -> None:
        self.request.settimeout(RUNTIME_TIMEOUT)
        try:
            with self.server.context.wrap_socket(self.request, server_side=True) as tls:
                received = b""
                while b"\r\n\r\n" not in received and len(received) < 65536:
                    chunk = tls.recv(4096)
                    if not chunk:
                        return
                    received += chunk
                body = b"wiretape doctor\n"
                tls.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
        except (ssl.SSLError, OSError):
            pass  # a client that does not trust the CA: it reports that itself


class _Relay(_Background):
    """Passes connections on to the proxy, noting the first request line of each."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.requests: list[str] = []
        self.unreachable = 0
        self.lock = threading.Lock()
        super().__init__(_RelayHandler)

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class _RelayHandler(socketserver.BaseRequestHandler):
    server: _Relay

    def handle(self) -> None:
        client = self.request
        first = client.recv(65536)
        if not first:
            return
        line = first.split(b"\r\n", 1)[0].decode("latin-1")
        method, _, rest = line.partition(" ")
        with self.server.lock:
            self.server.requests.append(f"{method} {rest.rsplit(' ', 1)[0]}"[:200])
        try:
            upstream = socket.create_connection(self.server.target, timeout=5)
        except OSError:
            with self.server.lock:
                self.server.unreachable += 1
            return
        with upstream:
            upstream.sendall(first)
            _pipe(client, upstream)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides have finished sending (or an error)."""
    other = {a: b, b: a}
    for sock in other:
        sock.settimeout(None)
    with selectors.DefaultSelector() as selector:
        for sock in other:
            selector.register(sock, selectors.EVENT_READ)
        sending = 2
        while sending:
            events = selector.select(timeout=600)
            if not events:
                return
            for key, _ in events:
                source = key.fileobj
                try:
                    data = source.recv(65536)
                    if data:
                        other[source].sendall(data)
                        continue
                    other[source].shutdown(socket.SHUT_WR)
                except OSError:
                    return
                selector.unregister(source)
                sending -= 1
