"""Measure wiretape's speed: each section times one part and adds rows to one table.

A section is a function of a `Run` that returns `Row`s, registered by name with `@section`.
`--quick` shrinks every section so that a whole run takes under a minute. The machinery the
proxy sections drive (a raw-socket load client, the processes under test) is in `benchlib/`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from benchlib.lab import Lab
from benchlib.load import Connection, Stream, Window, dial, drive, percentile, stream_events
from benchlib.load import process_cpu_seconds as cpu_seconds
from wiretape.tapes import (
    VERSION,
    Exchange,
    Request,
    Response,
    TapeWriter,
    Timings,
    load_tape,
    verify_tape,
)
from wiretape.tapes.chain import GENESIS, chain_digest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench-results.json"
MB = 1_000_000


@dataclass(slots=True)
class Row:
    """One measurement. `ratio` is its value against a reference's (1.0 = the same); the
    section says which reference, and which way is better."""

    section: str
    name: str
    value: float
    unit: str
    ratio: float | None = None
    note: str = ""


@dataclass(slots=True)
class Run:
    """What every section is given: how hard to try, and a scratch folder of its own."""

    quick: bool
    workdir: Path

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    @property
    def repeats(self) -> int:
        """Timings are the best of this many tries: the least disturbed by the rest of the box."""
        return 1 if self.quick else 3


Section = Callable[[Run], list[Row]]
SECTIONS: dict[str, Section] = {}


def section(name: str) -> Callable[[Section], Section]:
    def register(measure: Section) -> Section:
        SECTIONS[name] = measure
        return measure

    return register


def aim(met: bool, text: str) -> str:
    return f"aim {text}: {'met' if met else 'MISSED'}"


def best_time(repeats: int, action: Callable[[], float]) -> float:
    """The shortest of `repeats` timings; `action` returns the seconds it measured."""
    return min(action() for _ in range(repeats))


# -- tapes -------------------------------------------------------------------------------------


def chat_exchange(seq: int) -> Exchange:
    """A chat completion of about 1 KB on the tape, the size of a short agent turn."""
    request_body = (
        b'{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You book meetings."},'
        b'{"role":"user","content":"Find thirty minutes with Ana next week."}],'
        b'"tools":[{"type":"function","function":{"name":"calendar_search"}}]}'
    )
    response_body = (
        b'{"id":"chatcmpl-7a1","object":"chat.completion","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"Ana is free Tuesday 9:30."},"finish_reason":"stop"}]}'
    )
    request = Request(
        "POST",
        "https://api.openai.com/v1/chat/completions",
        "HTTP/1.1",
        [("content-type", "application/json"), ("accept", "application/json")],
        request_body,
    )
    response = Response(
        200,
        "OK",
        "HTTP/1.1",
        [("content-type", "application/json"), ("x-request-id", f"req_{seq:08d}")],
        body=response_body,
    )
    return Exchange(seq, seq * 1_000, request, response, timings=Timings(180_000, 240_000))


def append_seconds(path: Path, exchanges: list[Exchange], fsync: str) -> float:
    """Seconds to append `exchanges` (opening and sealing the tape are not counted)."""
    with TapeWriter(path, redaction={}, fsync=fsync, overwrite=True) as writer:
        started = time.perf_counter()
        for exchange in exchanges:
            writer.append(exchange)
        return time.perf_counter() - started


def verify_seconds(path: Path) -> float:
    started = time.perf_counter()
    verify_tape(path)
    return time.perf_counter() - started


def blake3_seconds(lines: list[bytes]) -> float:
    """Seconds to hash each line with its own hasher, chained as the tape chains them."""
    previous = GENESIS
    started = time.perf_counter()
    for line in lines:
        previous = chain_digest(previous, line)
    return time.perf_counter() - started


@section("tapes")
def tapes(run: Run) -> list[Row]:
    count = run.size(200_000, 40_000)
    exchanges = [chat_exchange(seq) for seq in range(count)]
    rows = []
    for policy in ("batched", "never"):
        path = run.workdir / f"{policy}.tape"
        rate = count / best_time(run.repeats, partial(append_seconds, path, exchanges, policy))
        rows.append(
            Row(
                "tapes",
                f"append ~1 KB exchange, fsync {policy}",
                rate,
                "exchanges/s",
                note=aim(rate >= 50_000, ">= 50,000/s"),
            )
        )

    tape = run.workdir / "never.tape"
    data = tape.read_bytes()
    lines = data.splitlines(keepends=True)
    verify_rate = len(data) / MB / best_time(run.repeats, partial(verify_seconds, tape))
    blake3_rate = len(data) / MB / best_time(run.repeats, partial(blake3_seconds, lines))
    slower = blake3_rate / verify_rate
    mean_line = len(data) / len(lines)
    return [
        *rows,
        Row("tapes", "verify (read, chain, parse, check)", verify_rate, "MB/s", slower,
            aim(slower <= 3, "within 3x of BLAKE3")),
        Row("tapes", "BLAKE3 alone, one hasher per line", blake3_rate, "MB/s", 1.0,
            f"the limit for verify; {len(lines):,} lines of {mean_line:,.0f} B, "
            f"{len(data) / MB:,.0f} MB"),
    ]  # fmt: skip


# -- record: what recording adds to each request -----------------------------------------------
#
# The fake upstream (a subprocess) serves HTTPS, as LLM APIs do, to every mode: direct (the
# limit), `wiretape record` in proxy mode (CONNECT, then TLS with wiretape's CA) and in base-URL
# mode (plain HTTP to `--reverse`, TLS upstream), and bare `mitmdump -w` in the same two shapes.
# Both proxies connect upstream lazily; beyond that they differ in what they are: mitmdump runs
# its ~40 default addons on every hook, buffers each response whole and writes mitmproxy flows;
# wiretape runs seven addons plus its recorder, streams responses through, redacts and appends
# to a hash-chained tape (fsync batched).
#
# The modes are interleaved round by round with the order rotating, so that drift of the
# machine falls on every mode alike. Each figure is the median over the rounds, and each ratio
# or difference is one of those medians against another (so the table can be checked by hand):
# RATIO is throughput as a fraction of direct's, latency as a multiple of direct's, and CPU per
# request as a multiple of mitmdump's in the same shape.

CHAT_PATH = "/v1/chat/completions"
CHAT_BODY = (
    b'{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You book meetings for a '
    b'small team."},{"role":"user","content":"Find thirty minutes with Ana next week, mornings '
    b'preferred, not Monday, and draft a short invitation for it."}],"temperature":0.2,'
    b'"max_tokens":200,"user":"bench"}'
)
CHAT_HEADERS = (
    "content-type: application/json",
    "accept: application/json",
    # Shaped like a real key, so the recorder's redaction does its real work.
    "authorization: Bearer sk-proj-Bench0Key0Not0Real0000000000000000000000000000",
    "user-agent: wiretape-bench",
)
SSE_EVENTS, SSE_INTERVAL_MS = 50, 20
SSE_PATH = f"/fake/sse?events={SSE_EVENTS}&interval_ms={SSE_INTERVAL_MS}"
WARM_SSE_PATH = "/fake/sse?events=3&interval_ms=0"
CONCURRENCY = (1, 16)
MODES = ("direct", "mitmdump-proxy", "record-proxy", "mitmdump-reverse", "record-reverse")
RECORD_MODES = ("record-proxy", "record-reverse")
BARE = {"record-proxy": "mitmdump-proxy", "record-reverse": "mitmdump-reverse"}
LABELS = {
    "direct": "direct",
    "mitmdump-proxy": "mitmdump -w, proxy",
    "record-proxy": "record, proxy mode",
    "mitmdump-reverse": "mitmdump -w, reverse",
    "record-reverse": "record, base-URL mode",
}
MS = 1000
US = 1_000_000


def rotated(modes: tuple[str, ...], by: int) -> tuple[str, ...]:
    by %= len(modes)
    return modes[by:] + modes[:by]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def rate(window: Window) -> float:
    return window.rate


def p50(window: Window) -> float:
    return percentile(window.latencies, 0.50) * MS


def p99(window: Window) -> float:
    return percentile(window.latencies, 0.99) * MS


def proxy_cpu(window: Window) -> float:
    assert window.proxy_cpu is not None
    return window.proxy_cpu / window.requests * MS


def client_cpu(window: Window) -> float:
    return window.client_cpu / window.requests * US


@dataclass(slots=True)
class Rounds:
    """Each mode's timed windows at each concurrency, one per round, in round order."""

    windows: dict[tuple[str, int], list[Window]]
    upstream_cpu: dict[tuple[str, int], list[float]]  # µs of the upstream's CPU per request

    def median(self, mode: str, c: int, metric: Callable[[Window], float]) -> float:
        return median(metric(window) for window in self.windows[mode, c])

    def ratio(self, mode: str, reference: str, c: int, metric: Callable[[Window], float]) -> float:
        return self.median(mode, c, metric) / self.median(reference, c, metric)

    def difference(
        self, mode: str, reference: str, c: int, metric: Callable[[Window], float]
    ) -> float:
        return self.median(mode, c, metric) - self.median(reference, c, metric)


def run_rounds(run: Run, lab: Lab, connections: dict[tuple[str, int], list[Connection]]) -> Rounds:
    rounds, seconds, warm = run.size(5, 2), (0.8 if run.quick else 3.0), 0.1 if run.quick else 0.2
    requests = {
        mode: lab.targets[mode].request("POST", CHAT_PATH, CHAT_BODY, CHAT_HEADERS)
        for mode in MODES
    }
    result = Rounds(defaultdict(list), defaultdict(list))
    for number in range(rounds):
        for c in CONCURRENCY:
            for mode in rotated(MODES, number):
                group = connections[mode, c]
                drive(group, requests[mode], warm)
                upstream_before = cpu_seconds(lab.upstream.pid)
                window = drive(group, requests[mode], seconds, lab.targets[mode].pid)
                upstream = cpu_seconds(lab.upstream.pid) - upstream_before
                result.windows[mode, c].append(window)
                result.upstream_cpu[mode, c].append(upstream / window.requests * US)
    return result


@section("record")
def record(run: Run) -> list[Row]:
    """Small JSON exchanges at concurrency 1 and 16: direct, through wiretape record in both
    modes, and through bare `mitmdump -w` in the same two shapes."""
    with Lab(run.workdir, mitmdump=True) as lab:
        connections = {
            (mode, c): [dial(lab.targets[mode]) for _ in range(c)]
            for mode in MODES
            for c in CONCURRENCY
        }
        try:
            rss = {mode: [lab.services[mode].rss_mb()] for mode in RECORD_MODES}
            rounds = run_rounds(run, lab, connections)
            for mode in RECORD_MODES:
                rss[mode].append(lab.services[mode].rss_mb())
        finally:
            for group in connections.values():
                for connection in group:
                    connection.close()
    sent = {
        mode: sum(conn.sent for c in CONCURRENCY for conn in connections[mode, c])
        for mode in RECORD_MODES
    }
    body_size = connections["direct", 1][0].body_size
    rows = []
    for c in CONCURRENCY:
        rows += throughput_rows(rounds, c, body_size)
        rows += latency_rows(rounds, c)
        rows += cpu_rows(rounds, c)
    rows.append(client_row(rounds))
    return rows + [tape_row("record", lab, mode, sent[mode], rss[mode]) for mode in RECORD_MODES]


def throughput_rows(rounds: Rounds, c: int, body_size: int) -> list[Row]:
    rows = []
    for mode in MODES:
        if mode == "direct":
            upstream = median(rounds.upstream_cpu[mode, c])
            note = f"the limit; upstream {upstream:,.0f} µs CPU/req"
            if c == 1:
                note += f"; POST {len(CHAT_BODY)} B JSON, {body_size} B JSON back"
        elif mode in BARE:
            versus = rounds.ratio(mode, BARE[mode], c, rate)
            note = f"{versus:.2f}x {LABELS[BARE[mode]]}; {aim(versus >= 0.95, '>= 0.95x of it')}"
        else:
            note = ""
        rows.append(
            Row(
                "record",
                f"C={c:<2} throughput, {LABELS[mode]}",
                rounds.median(mode, c, rate),
                "req/s",
                rounds.ratio(mode, "direct", c, rate),
                note,
            )
        )
    return rows


def latency_rows(rounds: Rounds, c: int) -> list[Row]:
    rows = []
    for name, metric in (("p50", p50), ("p99", p99)):
        for mode in MODES:
            note = ""
            if mode != "direct":
                added = rounds.difference(mode, "direct", c, metric)
                note = f"{added:+.2f} ms over direct"
            if mode in BARE:
                versus = rounds.difference(mode, BARE[mode], c, metric)
                note += f", {versus:+.2f} ms vs {LABELS[BARE[mode]]}"
            rows.append(
                Row(
                    "record",
                    f"C={c:<2} latency {name}, {LABELS[mode]}",
                    rounds.median(mode, c, metric),
                    "ms",
                    rounds.ratio(mode, "direct", c, metric),
                    note,
                )
            )
    return rows


def cpu_rows(rounds: Rounds, c: int) -> list[Row]:
    rows = []
    for mode in MODES[1:]:
        reference = BARE.get(mode, mode)
        note = f"ratio: vs {LABELS[reference]}" if mode in BARE else "proxy process, user + system"
        rows.append(
            Row(
                "record",
                f"C={c:<2} CPU per request, {LABELS[mode]}",
                rounds.median(mode, c, proxy_cpu),
                "ms",
                rounds.ratio(mode, reference, c, proxy_cpu),
                note,
            )
        )
    return rows


def client_row(rounds: Rounds) -> Row:
    """The load client's own CPU per request where it works hardest: direct at the top C."""
    c = CONCURRENCY[-1]
    cost = rounds.median("direct", c, client_cpu)
    reached = rounds.median("direct", c, rate)
    return Row(
        "record",
        f"load client CPU per request, direct C={c}",
        cost,
        "µs",
        note=f"raw sockets, one thread: ceiling ~{US / cost:,.0f} req/s; direct reached "
        f"{reached:,.0f} req/s",
    )


def tape_row(name: str, lab: Lab, mode: str, sent: int, rss: list[float], streams: int = 0) -> Row:
    """Whether the recorder kept every exchange it forwarded (and, given `streams`, each SSE
    event as a chunk of its own), and what it held in memory."""
    check = lab.tape_check(mode)
    if check.problem is not None:
        note = f"tape did not verify: {check.problem}"
    elif check.exchanges != sent:
        note = f"MISSING: {sent:,} requests sent, {check.exchanges:,} recorded"
    else:
        note = f"sealed and verified, all {sent:,} requests recorded"
    if streams and check.problem is None:
        counts = sse_chunk_counts(lab.workdir / f"{mode}.tape")
        if counts == [SSE_EVENTS] * streams:
            note += f", {SSE_EVENTS} chunks per stream"
        else:
            note += f"; WRONG chunk counts {counts}, expected {streams} x {SSE_EVENTS}"
    if check.exit_code != 0:
        note += f"; exit code {check.exit_code} on SIGTERM"
    note += f"; RSS {rss[0]:,.0f} -> {rss[-1]:,.0f} MB"
    return Row(name, f"tape, {LABELS[mode]}", check.exchanges or 0, "exchanges", note=note)


@section("record-sse")
def record_sse(run: Run) -> list[Row]:
    """An SSE stream of 50 events 20 ms apart: time to its first byte, and the gaps between
    events, direct and through wiretape record in both modes (mitmdump -w buffers a stream
    whole, so its first byte comes after the last event: nothing to compare). One stream per
    mode per round, on a keep-alive connection whose upstream side is already open."""
    modes = ("direct", *RECORD_MODES)
    rounds = run.size(10, 3)
    streams: dict[str, list[Stream]] = defaultdict(list)
    with Lab(run.workdir, mitmdump=False) as lab:
        connections = {mode: dial(lab.targets[mode]) for mode in modes}
        try:
            rss = {mode: [lab.services[mode].rss_mb()] for mode in RECORD_MODES}
            for mode in modes:  # the upstream connection open, the streaming path run once
                warm = lab.targets[mode].request("GET", "/fake/json?size=300")
                drive([connections[mode]], warm, 0)
                stream_events(connections[mode], lab.targets[mode].request("GET", WARM_SSE_PATH))
            requests = {mode: lab.targets[mode].request("GET", SSE_PATH) for mode in modes}
            for number in range(rounds):
                for mode in rotated(modes, number):
                    streams[mode].append(stream_events(connections[mode], requests[mode]))
            for mode in RECORD_MODES:
                rss[mode].append(lab.services[mode].rss_mb())
        finally:
            for connection in connections.values():
                connection.close()
    sent = {mode: connections[mode].sent + 1 + rounds for mode in RECORD_MODES}
    tapes = [
        tape_row("record-sse", lab, mode, sent[mode], rss[mode], streams=rounds)
        for mode in RECORD_MODES
    ]
    return sse_rows(modes, streams) + tapes


def sse_chunk_counts(path: Path) -> list[int]:
    """How many chunks the tape holds for each SSE exchange, in order."""
    return [
        len(exchange.response.chunks or ())
        for exchange in load_tape(path).exchanges
        if exchange.response is not None and SSE_PATH in exchange.request.url
    ]


def sse_rows(modes: tuple[str, ...], streams: dict[str, list[Stream]]) -> list[Row]:
    interval = SSE_INTERVAL_MS / MS
    rows = []
    direct = median(stream.first_byte for stream in streams["direct"]) * MS
    for mode in modes:
        first = median(stream.first_byte for stream in streams[mode]) * MS
        slowest = max(stream.first_byte for stream in streams[mode]) * MS
        note = f"median of {len(streams[mode])}, slowest {slowest:.2f} ms"
        if mode != "direct":
            added = first - direct
            note += f"; {added:+.2f} ms over direct: {aim(added <= 5, 'within 5 ms of direct')}"
        rows.append(
            Row("record-sse", f"first chunk, {LABELS[mode]}", first, "ms", first / direct, note)
        )
    for mode in modes:
        gaps = sorted(
            later - earlier
            for stream in streams[mode]
            for earlier, later in itertools.pairwise(stream.events)
        )
        off = sorted(abs(gap - interval) * MS for gap in gaps)
        counts = {len(stream.events) for stream in streams[mode]}
        note = f"off {SSE_INTERVAL_MS} ms by: p99 {percentile(off, 0.99):.2f}, max {off[-1]:.2f}"
        if counts != {SSE_EVENTS}:
            note += f"; WRONG event counts {sorted(counts)}, expected {SSE_EVENTS}"
        gap = percentile(gaps, 0.5) * MS
        rows.append(Row("record-sse", f"gap p50, {LABELS[mode]}", gap, "ms", note=note))
    return rows


# -- running and reporting ---------------------------------------------------------------------


def run_sections(names: list[str], quick: bool) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"wiretape-bench-{name}-") as workdir:
            rows += SECTIONS[name](Run(quick=quick, workdir=Path(workdir)))
    return rows


def format_value(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:#,.3g}" if value < 10 else f"{value:,.1f}"


def format_table(rows: list[Row]) -> str:
    head = ("SECTION", "MEASURE", "VALUE", "UNIT", "RATIO", "NOTE")
    cells = [
        (
            row.section,
            row.name,
            format_value(row.value),
            row.unit,
            "" if row.ratio is None else f"{row.ratio:.2f}x",
            row.note,
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [head, *cells]) for i in range(len(head))]
    right = {2, 4}
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in [head, *cells]
    )


def results_document(rows: list[Row], names: list[str], quick: bool, started: str) -> dict:
    return {
        "wiretape": VERSION,
        "started": started,
        "quick": quick,
        "sections": names,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "results": [asdict(row) for row in rows],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, one try each: under a minute"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help=f"where to write the results (default: {DEFAULT_JSON.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=list(SECTIONS),
        metavar="SECTION",
        help=f"run only this section (repeatable): {', '.join(SECTIONS)}",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or list(SECTIONS)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows = run_sections(names, args.quick)
    print(format_table(rows))
    args.json.write_text(json.dumps(results_document(rows, names, args.quick, started), indent=2))
    print(f"\nresults written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
