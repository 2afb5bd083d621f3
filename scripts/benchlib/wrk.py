"""wrk, the HTTP load generator in C, where it is installed: a load that costs far less CPU per
request than any Python client, for measuring what a server can do on one core.

wrk cannot go through a proxy; it speaks HTTP/1.1 (or HTTPS) straight to a URL. A Lua script
sets the request, and its `done` hook prints the summary as one JSON line, so nothing depends
on the layout of wrk's human report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .services import pinned

__all__ = ["WrkResult", "run_wrk", "wrk_path"]

_SCRIPT = """\
wrk.method = {method}
wrk.body = {body}
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,'
      .. '"socket_errors":%d,"bad_status":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    socket_errors: int
    bad_status: int  # responses that were not 2xx or 3xx

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def wrk_path() -> str | None:
    return shutil.which("wrk")


def run_wrk(
    url: str,
    method: str,
    body: bytes,
    headers: Iterable[str],
    workdir: Path,
    *,
    connections: int = 16,
    seconds: int = 10,
    cpus: Iterable[int] | None = None,
) -> WrkResult:
    """One wrk thread keeping `connections` keep-alive connections busy for `seconds` (whole
    seconds: wrk takes no less)."""
    wrk = wrk_path()
    if wrk is None:
        raise FileNotFoundError("wrk is not installed")
    lines = []
    for header in headers:
        name, value = header.split(":", 1)
        # The spaces matter: "[[[" would open a long string.
        lines.append(f"wrk.headers[ {_lua(name.strip())} ] = {_lua(value.strip())}")
    script = workdir / "wrk-request.lua"
    script.write_text(
        _SCRIPT.format(method=_lua(method), body=_lua(body.decode()), headers="\n".join(lines))
    )
    argv = [wrk, "-t1", f"-c{connections}", f"-d{max(1, seconds)}s", "-s", str(script), url]
    if cpus is not None:
        argv = [*pinned(cpus), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
    for line in done.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            summary = json.loads(line.removeprefix("WRK_JSON "))
            return WrkResult(
                summary["requests"],
                summary["duration_us"] / 1e6,
                summary["p50_us"] / 1e3,
                summary["p99_us"] / 1e3,
                summary["socket_errors"],
                summary["bad_status"],
            )
    output = (done.stdout + done.stderr).strip()[-600:]
    raise RuntimeError(f"wrk printed no summary (exit {done.returncode}): {output}")


def _lua(text: str) -> str:
    """A Lua long-bracket string literal holding `text` as it is."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[{text}]{'=' * level}]"
