"""Measure wiretape's speed: each section times one part and adds rows to one table.

A section is a function of a `Run` that returns `Row`s, registered by name with `@section`.
`--quick` shrinks every section so that a whole run takes under a minute. The machinery the
proxy sections drive (a raw-socket load client, the processes under test, wrk) is in
`benchlib/`; what several sections use, such as the recorded traffic the replay sections
replay, is made once per run (`Run.shared`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from benchlib.lab import Lab, Recorded, ReplayLab
from benchlib.load import (
    Connection,
    Stream,
    Target,
    Window,
    dial,
    drive,
    drive_sequence,
    percentile,
    round_trip,
    stolen_seconds,
    stream_events,
)
from benchlib.load import process_cpu_seconds as cpu_seconds
from benchlib.services import (
    InProcessClient,
    Service,
    ServiceError,
    free_port,
    pin,
    replay_address,
    start_bare_server,
    start_replay_server,
    upstream_requests,
)
from benchlib.wrk import run_wrk, wrk_path
from wiretape.matching import MatchRules, match_key
from wiretape.redact import Redactor, load_or_create_key
from wiretape.replay import Replayer
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


class Shared:
    """What the sections of one run share: each thing is made by the first section that asks
    for it, in a folder of its own, and kept until the run ends."""

    def __init__(self, workdir: Path, resources: contextlib.ExitStack) -> None:
        self.workdir = workdir
        self.resources = resources
        self.made: dict[str, Any] = {}

    def get[T](self, name: str, make: Callable[[Path], AbstractContextManager[T]]) -> T:
        if name not in self.made:
            print(f"bench: making {name} ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            self.made[name] = self.resources.enter_context(make(self.workdir / name))
            took = time.perf_counter() - started
            print(f"bench: made {name} in {took:.1f} s", file=sys.stderr, flush=True)
        return self.made[name]


@dataclass(slots=True)
class Run:
    """What every section is given: how hard to try, a scratch folder of its own, and what
    the run's sections share."""

    quick: bool
    workdir: Path
    shared: Shared

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    @property
    def repeats(self) -> int:
        """Timings are the best of this many tries: the least disturbed by the rest of the box."""
        return 1 if self.quick else 3


Section = Callable[[Run], list[Row]]
SECTIONS: dict[str, Section] = {}
DEFAULT_SECTIONS: list[str] = []  # what a run without --only runs


def section(name: str, *, default: bool = True) -> Callable[[Section], Section]:
    def register(measure: Section) -> Section:
        SECTIONS[name] = measure
        if default:
            DEFAULT_SECTIONS.append(name)
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
    # Requests the upstream read during each window and its warm-up (when counted).
    upstream_requests: dict[tuple[str, int], list[int]]

    def median(self, mode: str, c: int, metric: Callable[[Window], float]) -> float:
        return median(metric(window) for window in self.windows[mode, c])

    def ratio(self, mode: str, reference: str, c: int, metric: Callable[[Window], float]) -> float:
        return self.median(mode, c, metric) / self.median(reference, c, metric)

    def difference(
        self, mode: str, reference: str, c: int, metric: Callable[[Window], float]
    ) -> float:
        return self.median(mode, c, metric) - self.median(reference, c, metric)


# What measures one window: (mode, concurrency, seconds) -> the window.
Measure = Callable[[str, int, float], Window]


def interleave(
    modes: tuple[str, ...],
    measure: Measure,
    upstream: Service,
    *,
    rounds: int,
    seconds: float,
    warm: float,
    count_upstream: bool = False,
) -> Rounds:
    """Round by round, each mode at each concurrency: an untimed warm-up window, then a timed
    one. The order of the modes rotates from round to round."""
    result = Rounds(defaultdict(list), defaultdict(list), defaultdict(list))
    for number in range(rounds):
        for c in CONCURRENCY:
            for mode in rotated(modes, number):
                requests_before = upstream_requests(upstream) if count_upstream else 0
                measure(mode, c, warm)
                upstream_before = cpu_seconds(upstream.pid)
                window = measure(mode, c, seconds)
                upstream_cpu = cpu_seconds(upstream.pid) - upstream_before
                result.windows[mode, c].append(window)
                result.upstream_cpu[mode, c].append(upstream_cpu / window.requests * US)
                if count_upstream:
                    read = upstream_requests(upstream) - requests_before
                    result.upstream_requests[mode, c].append(read)
    return result


def run_rounds(run: Run, lab: Lab, connections: dict[tuple[str, int], list[Connection]]) -> Rounds:
    requests = {
        mode: lab.targets[mode].request("POST", CHAT_PATH, CHAT_BODY, CHAT_HEADERS)
        for mode in MODES
    }

    def measure(mode: str, c: int, seconds: float) -> Window:
        return drive(connections[mode, c], requests[mode], seconds, lab.targets[mode].pid)

    return interleave(
        MODES,
        measure,
        lab.upstream,
        rounds=run.size(5, 2),
        seconds=0.3 if run.quick else 3.0,
        warm=0.05 if run.quick else 0.2,
    )


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
    rounds = run.size(10, 1)
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


# -- replay: answering from a tape ------------------------------------------------------------
#
# Everything replayed is recorded first, from the same fake upstream (benchlib.lab.ReplayLab,
# made once per run and shared by the replay sections): `wiretape record` in proxy mode writes
# the tape, `mitmdump -w` the flows for `--server-replay`, VCR.py a cassette. The request is
# an OpenAI Responses API call, about 300 B of JSON, answered with about 1 KB of JSON; the
# tape also holds an SSE stream. The recorders are then stopped and the replayers started.
# The upstream keeps running and counts the requests it reads, so every replaying window
# can show that it read none.
#
# Modes, interleaved as in `record`: direct (the raw-socket client to the upstream over TLS:
# the limit), `wiretape serve --allow-repeats` in proxy mode (CONNECT, then TLS from wiretape's
# CA) and in base-URL mode (plain HTTP), `mitmdump --server-replay` in the same two shapes
# (answers reused, misses killed, lazy connections: it never goes upstream), and VCR.py.
# VCR.py replays inside the client's process, so the raw-socket client cannot drive it: it is
# measured with httpx (a thread and a client per connection) in a process of its own, against
# the same httpx going direct. Its CPU per request is that whole process's, client included.

REPLAY_PATH = "/v1/responses"
REPLAY_BODY = (
    b'{"model":"gpt-4o-mini","instructions":"You book meetings for a small team. Answer in '
    b'one line.","input":"Find thirty minutes with Ana next week, mornings preferred, not '
    b'Monday, and draft a short invitation for it.","temperature":0.2,"max_output_tokens":'
    b'200,"user":"bench"}'
)
RECORDED = [
    Recorded("POST", REPLAY_PATH, REPLAY_BODY, CHAT_HEADERS),
    Recorded("GET", WARM_SSE_PATH),
    Recorded("GET", SSE_PATH),
]
WIRETAPE_REPLAY = ("replay-proxy", "replay-reverse")
MITMDUMP_REPLAY = ("mitmdump-replay-proxy", "mitmdump-replay-reverse")
RAW_REPLAY_MODES = ("direct", *WIRETAPE_REPLAY, *MITMDUMP_REPLAY)
IN_PROCESS_MODES = ("httpx-direct", "vcr")
REPLAY_MODES = (*RAW_REPLAY_MODES, *IN_PROCESS_MODES)
REPLAY_LABELS = {
    "direct": "direct",
    "replay-proxy": "wiretape replay, proxy mode",
    "replay-reverse": "wiretape replay, base-URL mode",
    "mitmdump-replay-proxy": "mitmdump --server-replay, proxy",
    "mitmdump-replay-reverse": "mitmdump --server-replay, reverse",
    "httpx-direct": "httpx direct (VCR.py's reference)",
    "vcr": "VCR.py replay, httpx in-process",
}
SAME_SHAPE = dict(zip(WIRETAPE_REPLAY, MITMDUMP_REPLAY, strict=True))
REPLAY_AIM_RATIO = 0.9
REPLAY_AIM_P50_MS = 0.5


def reference(mode: str) -> str:
    """What a mode's ratio is taken against: VCR.py against its own client going direct."""
    return "httpx-direct" if mode == "vcr" else "direct"


def replay_lab(run: Run) -> ReplayLab:
    return run.shared.get("replay-lab", lambda workdir: ReplayLab(workdir, RECORDED))


def in_process_window(client: InProcessClient, c: int, seconds: float) -> Window:
    result = client.window(c, seconds)
    return Window(
        result["requests"], result["seconds"], result["latencies"], result["cpu"], result["cpu"]
    )


@section("replay")
def replay(run: Run) -> list[Row]:
    """Small JSON exchanges at concurrency 1 and 16, replayed by wiretape in both modes, by
    `mitmdump --server-replay` in both shapes and by VCR.py, against going direct."""
    lab = replay_lab(run)
    targets = {"direct": lab.direct}
    connections: dict[tuple[str, int], list[Connection]] = {}
    try:
        for mode in WIRETAPE_REPLAY:
            targets[mode] = lab.serve(mode, reverse=mode == "replay-reverse")
        waiting = {
            mode: lab.mitmdump(mode, reverse=mode == "mitmdump-replay-reverse")
            for mode in MITMDUMP_REPLAY
        }
        clients = {
            mode: lab.in_process(mode, "direct" if mode == "httpx-direct" else "replay")
            for mode in IN_PROCESS_MODES
        }
        for mode, target in waiting.items():
            targets[mode] = target()
        for client in clients.values():
            client.ready()
        for mode in RAW_REPLAY_MODES:
            for c in CONCURRENCY:
                connections[mode, c] = [dial(targets[mode]) for _ in range(c)]
        requests = {
            mode: targets[mode].request("POST", REPLAY_PATH, REPLAY_BODY, CHAT_HEADERS)
            for mode in RAW_REPLAY_MODES
        }

        def measure(mode: str, c: int, seconds: float) -> Window:
            if mode in clients:
                return in_process_window(clients[mode], c, seconds)
            return drive(connections[mode, c], requests[mode], seconds, targets[mode].pid)

        rounds = interleave(
            REPLAY_MODES,
            measure,
            lab.upstream,
            rounds=run.size(5, 2),
            seconds=0.2 if run.quick else 2.0,
            warm=0.05 if run.quick else 0.2,
            count_upstream=True,
        )
    finally:
        for group in connections.values():
            for connection in group:
                connection.close()
        lab.stop_started()
    body_size = connections["direct", 1][0].body_size
    rows = []
    for c in CONCURRENCY:
        rows += replay_throughput_rows(rounds, c, body_size)
        rows += replay_latency_rows(rounds, c)
        rows += replay_cpu_rows(rounds, c)
    rows.append(upstream_row("replay", rounds, lab))
    for mode in WIRETAPE_REPLAY:
        sent = sum(conn.sent for c in CONCURRENCY for conn in connections[mode, c])
        rows.append(served_row("replay", lab, mode, REPLAY_LABELS[mode], sent))
    return rows


def replay_throughput_rows(rounds: Rounds, c: int, body_size: int) -> list[Row]:
    rows = []
    for mode in REPLAY_MODES:
        value = rounds.median(mode, c, rate)
        ratio = rounds.ratio(mode, reference(mode), c, rate)
        if mode == "direct":
            note = "the limit: raw-socket client, TLS to the upstream"
            if c == 1:
                note += f"; POST {len(REPLAY_BODY)} B JSON, {body_size} B JSON back"
        elif mode in WIRETAPE_REPLAY:
            versus = rounds.ratio(mode, SAME_SHAPE[mode], c, rate)
            met = ratio >= REPLAY_AIM_RATIO
            note = f"{aim(met, f'>= {REPLAY_AIM_RATIO}x direct')}; {versus:.1f}x mitmdump"
        elif mode == "httpx-direct":
            ratio = rounds.ratio(mode, "direct", c, rate)
            note = f"ratio vs raw-socket direct; httpx, {'a thread' if c == 1 else 'threads'}"
        elif mode == "vcr":
            raw = rounds.ratio(mode, "direct", c, rate)
            note = f"ratio vs httpx direct; {raw:.2f}x raw-socket direct"
        else:
            note = ""
        name = f"C={c:<2} throughput, {REPLAY_LABELS[mode]}"
        rows.append(Row("replay", name, value, "req/s", ratio, note))
    return rows


def replay_latency_rows(rounds: Rounds, c: int) -> list[Row]:
    rows = []
    for name, metric in (("p50", p50), ("p99", p99)):
        for mode in REPLAY_MODES:
            base = reference(mode)
            note = ""
            if mode != "direct" and mode != "httpx-direct":
                added = rounds.difference(mode, base, c, metric)
                note = f"{added:+.2f} ms over {REPLAY_LABELS[base]}"
                if mode in WIRETAPE_REPLAY and name == "p50":
                    met = added <= REPLAY_AIM_P50_MS
                    note += f"; {aim(met, f'within {REPLAY_AIM_P50_MS} ms of direct')}"
            ratio = None if mode == base else rounds.ratio(mode, base, c, metric)
            rows.append(
                Row(
                    "replay",
                    f"C={c:<2} latency {name}, {REPLAY_LABELS[mode]}",
                    rounds.median(mode, c, metric),
                    "ms",
                    ratio,
                    note,
                )
            )
    return rows


def replay_cpu_rows(rounds: Rounds, c: int) -> list[Row]:
    rows = []
    for mode in REPLAY_MODES[1:]:
        if mode in SAME_SHAPE:
            ratio = rounds.ratio(mode, SAME_SHAPE[mode], c, proxy_cpu)
            note = "ratio vs mitmdump in the same shape"
        elif mode == "vcr":
            ratio = rounds.ratio(mode, "httpx-direct", c, proxy_cpu)
            note = "the client's process (httpx + VCR.py); ratio vs httpx direct"
        elif mode == "httpx-direct":
            ratio, note = None, "the client's process (httpx alone)"
        else:
            ratio, note = None, "the proxy process, user + system"
        rows.append(
            Row(
                "replay",
                f"C={c:<2} CPU per request, {REPLAY_LABELS[mode]}",
                rounds.median(mode, c, proxy_cpu),
                "ms",
                ratio,
                note,
            )
        )
    return rows


def upstream_row(name: str, rounds: Rounds, lab: ReplayLab) -> Row:
    """Requests that reached the upstream while a replayer was measured: must be none."""
    replaying = [mode for mode in REPLAY_MODES if mode not in ("direct", "httpx-direct")]
    leaked = sum(sum(rounds.upstream_requests[mode, c]) for mode in replaying for c in CONCURRENCY)
    direct = sum(sum(rounds.upstream_requests["direct", c]) for c in CONCURRENCY)
    note = "none reached it: " if leaked == 0 else "FAILED: replay reached the upstream; "
    note += f"direct windows {direct:,} (as sent); recording {lab.recorded_requests}"
    return Row(name, "upstream requests while replaying", leaked, "requests", note=note)


def served_row(name: str, lab: ReplayLab, mode: str, label: str, sent: int) -> Row:
    """What `wiretape serve` reported on SIGTERM: every request answered from the tape."""
    report = lab.report(mode)
    if report is None:
        return Row(name, f"answered from the tape, {label}", 0, "requests", note="NO REPORT")
    summary = report["summary"]
    answered = summary["matched"] + summary["repeats_served"]
    note = f"client sent {sent:,}; missed {summary['missed']}"
    if answered != sent or summary["missed"]:
        note += ": MISMATCH"
    return Row(name, f"answered from the tape, {label}", answered, "requests", note=note)


# -- replay-sse: recorded pacing ----------------------------------------------------------------
#
# The recorded stream is 50 events 20 ms apart, one event per chunk. `--pace recorded` sends
# each chunk at its recorded offset from the request's arrival, so a replayed gap is judged
# against the recorded gap it reproduces (which carries the upstream's own jitter), and the
# direct gaps against the nominal 20 ms. `--pace fast` sends the whole stream at once.

SSE_REPLAY_MODES = ("direct", "paced-proxy", "paced-reverse", "fast-proxy")
SSE_LABELS = {
    "direct": "direct",
    "paced-proxy": "replay --pace recorded, proxy mode",
    "paced-reverse": "replay --pace recorded, base-URL mode",
    "fast-proxy": "replay --pace fast, proxy mode",
}
SSE_AIM_MS = 2.0


@section("replay-sse")
def replay_sse(run: Run) -> list[Row]:
    """The recorded SSE stream: time to its first chunk and the gaps between chunks, direct and
    replayed at the recorded pace and as fast as possible."""
    lab = replay_lab(run)
    rounds = run.size(10, 1)
    streams: dict[str, list[Stream]] = defaultdict(list)
    connections: dict[str, Connection] = {}
    try:
        targets = {
            "direct": lab.direct,
            "paced-proxy": lab.serve("paced-proxy", reverse=False, pace="recorded"),
            "paced-reverse": lab.serve("paced-reverse", reverse=True, pace="recorded"),
            "fast-proxy": lab.serve("fast-proxy", reverse=False, pace="fast"),
        }
        before = lab.upstream_requests()
        for mode, target in targets.items():
            connections[mode] = dial(target)
            stream_events(connections[mode], target.request("GET", WARM_SSE_PATH))
        requests = {mode: target.request("GET", SSE_PATH) for mode, target in targets.items()}
        steal_before, started = stolen_seconds(), time.perf_counter()
        for number in range(rounds):
            for mode in rotated(SSE_REPLAY_MODES, number):
                streams[mode].append(stream_events(connections[mode], requests[mode]))
        cpus = os.cpu_count() or 1
        stolen = (stolen_seconds() - steal_before) / (cpus * (time.perf_counter() - started))
        read = lab.upstream_requests() - before
    finally:
        for connection in connections.values():
            connection.close()
        lab.stop_started()
    recorded = recorded_sse(lab.tape)
    rows = sse_first_rows(streams, recorded) + sse_gap_rows(streams, recorded, stolen)
    leaked = read - (1 + rounds)  # the direct mode's warm-up and streams
    note = "none reached it" if leaked == 0 else "FAILED: replay reached the upstream"
    rows.append(Row("replay-sse", "upstream requests while replaying", leaked, "requests",
                    note=f"{note}; direct read {1 + rounds}"))  # fmt: skip
    return rows


def recorded_sse(tape: Path) -> list[float]:
    """When each chunk of the recorded SSE stream arrived, in seconds after the request."""
    for exchange in load_tape(tape).exchanges:
        if exchange.request.url.endswith(SSE_PATH) and exchange.response is not None:
            return [chunk.at_us / US for chunk in exchange.response.chunks or ()]
    raise ValueError(f"{tape}: no recorded SSE stream")


def sse_first_rows(streams: dict[str, list[Stream]], recorded: list[float]) -> list[Row]:
    rows = []
    direct = median(stream.first_byte for stream in streams["direct"]) * MS
    for mode in SSE_REPLAY_MODES:
        first = median(stream.first_byte for stream in streams[mode]) * MS
        slowest = max(stream.first_byte for stream in streams[mode]) * MS
        note = f"median of {len(streams[mode])}, slowest {slowest:.2f} ms"
        if mode.startswith("paced"):
            late = first - recorded[0] * MS
            note += f"; recorded at {recorded[0] * MS:.2f} ms, {late:+.2f} ms off it"
        elif mode != "direct":
            note += f"; {first - direct:+.2f} ms over direct"
        rows.append(
            Row("replay-sse", f"first chunk, {SSE_LABELS[mode]}", first, "ms", first / direct, note)
        )
    return rows


def sse_gap_rows(
    streams: dict[str, list[Stream]], recorded: list[float], stolen: float
) -> list[Row]:
    rows = []
    recorded_gaps = [later - earlier for earlier, later in itertools.pairwise(recorded)]
    direct_worst = 0.0
    for mode in SSE_REPLAY_MODES:
        counts = {len(stream.events) for stream in streams[mode]}
        gaps = [
            [later - earlier for earlier, later in itertools.pairwise(stream.events)]
            for stream in streams[mode]
        ]
        flat = sorted(gap for stream_gaps in gaps for gap in stream_gaps)
        if mode == "fast-proxy":
            whole = median(stream.events[-1] for stream in streams[mode]) * MS
            note = f"all {SSE_EVENTS} events {whole:.2f} ms after the request"
        else:
            if mode == "direct":
                wanted = [[SSE_INTERVAL_MS / MS] * len(stream_gaps) for stream_gaps in gaps]
                reference = f"{SSE_INTERVAL_MS} ms"
            else:
                wanted = [recorded_gaps] * len(gaps)
                reference = "the recorded gaps"
            off = sorted(
                abs(gap - want) * MS
                for stream_gaps, want_gaps in zip(gaps, wanted, strict=True)
                for gap, want in zip(stream_gaps, want_gaps, strict=False)
            )
            within = sum(value <= SSE_AIM_MS for value in off) / len(off)
            note = f"off {reference} by: p50 {percentile(off, 0.5):.2f}, p99 "
            note += f"{percentile(off, 0.99):.2f}, max {off[-1]:.2f} ms; {within:.0%} within "
            note += f"±{SSE_AIM_MS:g} ms"
            if mode == "direct":
                direct_worst = off[-1]
                note += f"; the hypervisor stole {stolen:.1%} of the CPU meanwhile"
            else:
                met = off[-1] <= SSE_AIM_MS
                note += f"; {aim(met, f'every gap within ±{SSE_AIM_MS:g} ms')}"
                if not met:
                    note += f" (direct's own worst: {direct_worst:.2f} ms)"
        if counts != {SSE_EVENTS} or len(recorded) != SSE_EVENTS:
            note += f"; WRONG event counts {sorted(counts)} (recorded {len(recorded)})"
        gap = percentile(flat, 0.5) * MS
        rows.append(Row("replay-sse", f"gap p50, {SSE_LABELS[mode]}", gap, "ms", note=note))
    return rows


# -- replay-capacity: one core under load ---------------------------------------------------------
#
# The server is pinned to core 0 and the load to core 1. wrk (one thread, 16 keep-alive
# connections) drives base-URL replay and, for comparison, `mitmdump --server-replay` in the
# same shape, the fake upstream itself (HTTPS), and a bare asyncio + httptools server that
# answers the same bytes with no work at all: the most any Python server on asyncio does on
# this machine, which the RATIO column is taken against. wrk cannot speak through a proxy, so
# proxy mode (CONNECT, then TLS) is loaded by the raw-socket client, 16 connections on one
# thread, beside the same client on base-URL replay and on the bare server. When a server
# does not use its whole core, the load was the limit, and its CPU per request tells what the
# core would do (the "one-core estimate"). The first row times a loopback round trip between
# two processes, on two cores and on one: what every request pays here for crossing cores.

CAPACITY_AIMS = {"replay-reverse": 20_000, "replay-proxy": 10_000}
CAPACITY_LABELS = {
    "bare": "bare asyncio + httptools, fixed answer",
    "replay-reverse": "wiretape replay, base-URL mode",
    "replay-proxy": "wiretape replay, proxy mode (CONNECT+TLS)",
    "mitmdump": "mitmdump --server-replay, reverse",
    "direct": "the fake upstream itself (HTTPS)",
}


@dataclass(slots=True)
class Pinning:
    """Which cores the server and the load run on (None: one CPU, nothing pinned)."""

    server: set[int] | None
    load: set[int] | None

    @classmethod
    def split(cls) -> Pinning:
        return cls({0}, {1}) if (os.cpu_count() or 1) >= 2 else cls(None, None)


@section("replay-capacity")
def replay_capacity(run: Run) -> list[Row]:
    """Requests per second that replay serves on one core, under wrk and the raw client.
    `--quick` leaves out the references that only compare (mitmdump, the upstream)."""
    lab = replay_lab(run)
    # wrk runs whole seconds; its warm-up run is left out when quick.
    seconds, warm = (1, 0) if run.quick else (10, 1)
    cores = Pinning.split()
    rows: list[Row] = []
    before = lab.upstream_requests()
    direct_read = 0
    body_file = run.workdir / "answer.json"
    answer = load_tape(lab.tape).exchanges[0].response
    assert answer is not None and answer.body is not None
    body_file.write_bytes(answer.body)
    try:
        rows.append(round_trip_row(run, cores))
        bare = start_bare_server("bare", run.workdir, body_file, cores.server)
        lab.started["bare"] = bare
        mitmdump = None
        if not run.quick:
            mitmdump = lab.mitmdump("capacity-mitmdump", reverse=True, cpus=cores.server)
        targets = {
            "bare": Target("bare", replay_address(bare), lab.origin, None, False, bare.pid),
            "replay-reverse": lab.serve("capacity-reverse", reverse=True, cpus=cores.server),
            "replay-proxy": lab.serve("capacity-proxy", reverse=False, cpus=cores.server),
        }
        if mitmdump is not None:
            targets["mitmdump"] = mitmdump()
        if wrk_path() is None:
            rows.append(Row("replay-capacity", "wrk runs", 0, "", note="SKIPPED: wrk is not "
                            "installed (Debian: apt-get install wrk)"))  # fmt: skip
        else:
            ceiling = 0.0
            for mode in ("bare", "replay-reverse", "mitmdump"):
                if mode not in targets:
                    continue
                address, pid = targets[mode].address, targets[mode].pid
                url = f"http://{address[0]}:{address[1]}{REPLAY_PATH}"
                row = wrk_row(run, mode, url, pid, seconds, warm, cores)
                ceiling = ceiling or row.value
                row.ratio = row.value / ceiling
                rows.append(row)
            if not run.quick:
                upstream = lab.upstream_requests()
                row = upstream_wrk_row(run, lab, seconds, warm, cores)
                row.ratio = row.value / ceiling
                rows.append(row)
                direct_read = lab.upstream_requests() - upstream
        ceiling = 0.0
        for mode in ("bare", "replay-proxy", "replay-reverse"):
            row = raw_capacity_row(mode, targets[mode], seconds, warm or 0.2, cores)
            ceiling = ceiling or row.value
            row.ratio = row.value / ceiling
            rows.append(row)
    finally:
        lab.stop_started()
    leaked = lab.upstream_requests() - before - direct_read
    note = "none reached it" if leaked == 0 else "FAILED: replay reached the upstream"
    if direct_read:
        note += f"; the wrk run on it read {direct_read:,}"
    rows.append(Row("replay-capacity", "upstream requests while replaying", leaked, "requests",
                    note=note))  # fmt: skip
    return rows


def upstream_wrk_row(run: Run, lab: ReplayLab, seconds: int, warm: int, cores: Pinning) -> Row:
    """The fake upstream under the same wrk load, moved onto the server's core meanwhile."""
    try:
        if cores.server is not None:
            pin(lab.upstream.pid, cores.server)
        url = lab.url + REPLAY_PATH
        return wrk_row(run, "direct", url, lab.upstream.pid, seconds, warm, cores)
    finally:
        pin(lab.upstream.pid, range(os.cpu_count() or 1))


def round_trip_row(run: Run, cores: Pinning) -> Row:
    """300 B to an echo server and back, the client on the other core, then on the same."""
    echo = start_bare_server("echo", run.workdir, None, cores.server)
    affinity = os.sched_getaffinity(0)
    try:
        address = replay_address(echo)
        times = {}
        for name, mine in (("apart", cores.load), ("together", cores.server)):
            if mine is not None:
                os.sched_setaffinity(0, mine)
            times[name] = round_trip(address, count=run.size(5000, 500))
    finally:
        os.sched_setaffinity(0, affinity)
        echo.stop()
    apart, together = times["apart"] * US, times["together"] * US
    return Row("replay-capacity", "loopback round trip, processes on two cores", apart, "µs",
               apart / together, f"ratio vs both on one core ({together:.0f} µs): what crossing "
               "cores costs each request on this machine")  # fmt: skip


def wrk_row(
    run: Run, mode: str, url: str, pid: int, seconds: int, warm: int, cores: Pinning
) -> Row:
    if warm:
        run_wrk(url, "POST", REPLAY_BODY, CHAT_HEADERS, run.workdir, seconds=warm, cpus=cores.load)
    cpu_before = cpu_seconds(pid)
    result = run_wrk(url, "POST", REPLAY_BODY, CHAT_HEADERS, run.workdir, seconds=seconds,
                     cpus=cores.load)  # fmt: skip
    used = cpu_seconds(pid) - cpu_before
    note = capacity_note(mode, result.rate, used, result.seconds, result.requests)
    note += f"; p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms"
    if result.socket_errors or result.bad_status:
        note += f"; ERRORS: {result.socket_errors} socket, {result.bad_status} non-2xx"
    if cores.server is None:
        note += "; NOT pinned (one CPU)"
    return Row("replay-capacity", f"wrk -c16: {CAPACITY_LABELS[mode]}", result.rate, "req/s",
               note=note)  # fmt: skip


def raw_capacity_row(mode: str, target: Target, seconds: float, warm: float, cores: Pinning) -> Row:
    connections = [dial(target) for _ in range(16)]
    request = target.request("POST", REPLAY_PATH, REPLAY_BODY, CHAT_HEADERS)
    affinity = os.sched_getaffinity(0)
    try:
        if cores.load is not None:
            os.sched_setaffinity(0, cores.load)
        drive(connections, request, warm)
        window = drive(connections, request, seconds, target.pid)
    finally:
        os.sched_setaffinity(0, affinity)
        for connection in connections:
            connection.close()
    assert window.proxy_cpu is not None
    note = capacity_note(mode, window.rate, window.proxy_cpu, window.seconds, window.requests)
    client = window.client_cpu / window.requests * US
    note += f"; client {client:.0f} µs CPU/req (its ceiling ~{US / client:,.0f} req/s)"
    note += f"; p50 {p50(window):.2f} ms"
    return Row("replay-capacity", f"raw client -c16: {CAPACITY_LABELS[mode]}", window.rate,
               "req/s", note=note)  # fmt: skip


def capacity_note(mode: str, reached: float, cpu: float, seconds: float, requests: int) -> str:
    busy = cpu / seconds
    per_request = cpu / requests * US
    note = f"server {busy:.0%} of a core, {per_request:.0f} µs CPU/req"
    if busy < 0.9:
        note += f" (one-core estimate {US / per_request:,.0f} req/s)"
    target = CAPACITY_AIMS.get(mode)
    if target is not None:
        note = f"{aim(reached >= target, f'>= {target:,} req/s')}; {note}"
    if mode == "bare":
        note = f"the ceiling, ratio 1.00x; {note}"
    return note


# -- replay-startup and replay-memory: large synthetic tapes --------------------------------------
#
# Written with TapeWriter: N distinct Responses API calls to https://api.openai.com (the input
# text numbered), each answered with about 1 KB of JSON, served in base-URL mode.

SYNTHETIC_ORIGIN = "https://api.openai.com"
SYNTHETIC_HEADERS = ("content-type: application/json", "accept: application/json")


def synthetic_body(seq: int) -> bytes:
    return REPLAY_BODY.replace(b"Find thirty", b"Request %08d: find thirty" % seq)


def synthetic_exchange(seq: int) -> Exchange:
    text = f"Request {seq:08d}: Tuesday 9:30 with Ana works; invitation drafted."
    answer = {
        "id": f"resp_{seq:024x}",
        "object": "response",
        "created_at": 1735689600,
        "status": "completed",
        "model": "gpt-4o-mini",
        "output": [
            {
                "id": f"msg_{seq:024x}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "text": text}],
            }
        ],
        "parallel_tool_calls": True,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 0.2,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {"input_tokens": 63, "output_tokens": 20, "total_tokens": 83},
        "user": "bench",
        "metadata": {},
    }
    request = Request(
        "POST",
        SYNTHETIC_ORIGIN + REPLAY_PATH,
        "HTTP/1.1",
        [tuple(header.split(": ", 1)) for header in SYNTHETIC_HEADERS],  # type: ignore[misc]
        synthetic_body(seq),
    )
    response = Response(
        200,
        "OK",
        "HTTP/1.1",
        [("content-type", "application/json"), ("x-request-id", f"req_{seq:024x}")],
        body=json.dumps(answer, separators=(",", ":")).encode(),
    )
    return Exchange(seq, seq * 1_000, request, response, timings=Timings(180_000, 240_000))


def write_synthetic_tape(path: Path, count: int) -> None:
    with TapeWriter(path, redaction={}, fsync="never", overwrite=True) as writer:
        for seq in range(count):
            writer.append(synthetic_exchange(seq))


def synthetic_target(name: str, service: Service, port: int) -> Target:
    return Target(name, ("127.0.0.1", port), ("api.openai.com", 443), None, False, service.pid)


STARTUP_EXCHANGES = 2_000
STARTUP_AIM_S = 0.3
IMPORT_SHOWN_MS = 5.0  # imports cheaper than this are not named


@section("replay-startup")
def replay_startup(run: Run) -> list[Row]:
    """From launching `wiretape serve` on a 2,000-exchange tape to its first answer.

    Timed as installed copies start, with their bytecode cached. A cache of its own in the
    scratch folder (PYTHONPYCACHEPREFIX) keeps the work tree clean and works where
    PYTHONDONTWRITEBYTECODE is set; one row times a start that compiles wiretape's sources.
    """
    tape = run.workdir / "startup.tape"
    write_synthetic_tape(tape, STARTUP_EXCHANGES)
    home = run.workdir / "home"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(run.workdir / "pycache")
    launch_seconds(tape, home, env)  # writes the bytecode, creates the home's key
    times = sorted(launch_seconds(tape, home, env) for _ in range(run.size(7, 2)))
    ready = median(times)
    met = ready <= STARTUP_AIM_S
    uncached = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    uncached["PYTHONDONTWRITEBYTECODE"] = "1"
    compiling = median(launch_seconds(tape, home, uncached) for _ in range(run.size(3, 1)))
    rows = [
        Row("replay-startup", f"ready, {STARTUP_EXCHANGES:,}-exchange tape", ready * MS, "ms",
            note=f"launch to first answer, median of {len(times)} ({times[0] * MS:.0f}-"
            f"{times[-1] * MS:.0f} ms); {aim(met, f'within {STARTUP_AIM_S:g} s')}"),
        Row("replay-startup", "  the same, compiling wiretape's sources", compiling * MS, "ms",
            compiling / ready, "no bytecode written or cached (PYTHONDONTWRITEBYTECODE=1), as "
            "in an environment that sets it"),
    ]  # fmt: skip
    tree = import_tree(tape, home, run.workdir, env)
    python = median(python_seconds(env) for _ in range(run.size(5, 3)))
    names = [node.name for node in tree if "__main__" not in node.name]
    imports = median(import_seconds(names, env) for _ in range(run.size(3, 1)))
    traced = sum(node.cumulative for node in tree) / 1000
    rows += [
        Row("replay-startup", "  of which: python itself (-c pass)", python * MS, "ms",
            note="interpreter and site, nothing of wiretape's"),
        Row("replay-startup", "  of which: imports", imports * MS, "ms",
            note=f"what `wiretape serve` imports, timed alone; {traced:.0f} ms under -X "
            "importtime, whose parts follow"),
        Row("replay-startup", f"  of which: verify and index {STARTUP_EXCHANGES:,} exchanges",
            best_time(3, partial(index_seconds, tape, home)) * MS, "ms",
            note="Replayer() in-process: read, chain, parse, match keys"),
    ]  # fmt: skip
    for name, cost, note in heavy_imports(tree):
        rows.append(Row("replay-startup", f"  import {name}", cost / 1000, "ms", note=note))
    return rows


def launch_seconds(tape: Path, home: Path, env: dict[str, str]) -> float:
    """Seconds from starting `wiretape serve` to the end of its first answer."""
    port = free_port()
    request = Target("startup", ("127.0.0.1", port), ("api.openai.com", 443), None).request(
        "POST", REPLAY_PATH, synthetic_body(0), SYNTHETIC_HEADERS
    )
    started = time.perf_counter()
    service = start_replay_server(
        "startup", tape, home, reverse=SYNTHETIC_ORIGIN, port=port, pace="fast", env=env
    )
    try:
        deadline = started + 30
        while True:
            try:
                connection = dial(synthetic_target("startup", service, port))
                break
            except ConnectionRefusedError:
                if service.process.poll() is not None or time.perf_counter() > deadline:
                    raise ServiceError(f"wiretape serve did not start: {service.log}") from None
                time.sleep(0.001)
        drive([connection], request, 0)
        ready = time.perf_counter() - started
        connection.close()
    finally:
        service.stop()
    return ready


def python_seconds(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
    return time.perf_counter() - started


def import_seconds(names: list[str], env: dict[str, str]) -> float:
    """Seconds a fresh interpreter spends importing `names`, timed inside it."""
    code = (
        f"import time; started = time.perf_counter(); import {', '.join(names)}; "
        "print(time.perf_counter() - started)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
    return float(done.stdout)


def index_seconds(tape: Path, home: Path) -> float:
    started = time.perf_counter()
    Replayer(tape, Redactor(load_or_create_key(home)), allow_repeats=True).close()
    return time.perf_counter() - started


@dataclass(slots=True)
class ImportNode:
    name: str
    own: int  # µs
    cumulative: int  # µs
    children: list[ImportNode]


def import_tree(tape: Path, home: Path, workdir: Path, env: dict[str, str]) -> list[ImportNode]:
    """The imports of one `wiretape serve` start, as `python -X importtime` reports them."""
    argv = [sys.executable, "-X", "importtime", "-m", "wiretape", "serve", str(tape), "--listen",
            "127.0.0.1:0", "--reverse", SYNTHETIC_ORIGIN, "--quiet"]  # fmt: skip
    service = Service("importtime", argv, workdir / "importtime.log",
                      dict(env, WIRETAPE_HOME=str(home)))  # fmt: skip
    try:
        service.wait_for(r"^http://")
    finally:
        service.stop()
    stack: list[tuple[int, ImportNode]] = []
    pattern = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")
    for line in service.log.read_text().splitlines():
        found = pattern.match(line)
        if not found:
            continue
        depth = (len(found.group(3)) - 1) // 2
        node = ImportNode(found.group(4), int(found.group(1)), int(found.group(2)), [])
        while stack and stack[-1][0] > depth:  # printed before their parent: its children
            node.children.insert(0, stack.pop()[1])
        stack.append((depth, node))
    return [node for _, node in stack]


def heavy_imports(roots: list[ImportNode]) -> list[tuple[str, int, str]]:
    """What wiretape's own modules cost to import: each one's own time, and each other
    package it imports itself (not through another wiretape module), heaviest first."""
    found: list[tuple[str, int, str]] = []

    def walk(node: ImportNode, chain: tuple[str, ...]) -> None:
        ours = node.name.split(".")[0] == "wiretape"
        if ours and node.own >= IMPORT_SHOWN_MS * 1000:
            found.append((node.name, node.own, "its own code, imports excluded"))
        if not ours and chain and chain[-1].split(".")[0] == "wiretape":
            if node.cumulative >= IMPORT_SHOWN_MS * 1000:
                found.append((node.name, node.cumulative, f"imported by {' > '.join(chain)}"))
            return
        for child in node.children:
            walk(child, (*chain, node.name) if ours else ())

    for root in roots:
        walk(root, ())
    return sorted(found, key=lambda item: -item[1])


MEMORY_EXCHANGES = 100_000


@section("replay-memory")
def replay_memory(run: Run) -> list[Row]:
    """Peak memory of `wiretape serve` on a 100,000-exchange tape: loaded, then after serving
    every exchange once (N requests) and after 2N more (repeats)."""
    count = run.size(MEMORY_EXCHANGES, 5_000)
    tape = run.workdir / "memory.tape"
    write_synthetic_tape(tape, count)
    home = run.workdir / "home"
    port = free_port()
    report = run.workdir / "memory.report.json"
    service = start_replay_server(
        "memory", tape, home, reverse=SYNTHETIC_ORIGIN, port=port, report=report
    )
    connections: list[Connection] = []
    status: list[dict[str, float]] = []
    try:
        replay_address(service)
        target = synthetic_target("memory", service, port)
        connections = [dial(target) for _ in range(16)]

        def requests(start: int, stop: int) -> Iterator[bytes]:
            for seq in range(start, stop):
                body = synthetic_body(seq % count)
                yield target.request("POST", REPLAY_PATH, body, SYNTHETIC_HEADERS)

        status.append(memory_status(service.pid))
        started = time.perf_counter()
        drive_sequence(connections, requests(0, count))
        status.append(memory_status(service.pid))
        drive_sequence(connections, requests(count, 3 * count))
        served_rate = 3 * count / (time.perf_counter() - started)
        status.append(memory_status(service.pid))
    finally:
        for connection in connections:
            connection.close()
        service.stop()
    summary = json.loads(report.read_text())["summary"]
    loaded, once, thrice = status
    growth = thrice["VmHWM"] - once["VmHWM"]
    flat = growth <= max(1.0, 0.01 * once["VmHWM"])
    size = tape.stat().st_size / MB
    checks = f"{summary['matched']:,} matched, {summary['repeats_served']:,} repeats, "
    checks += f"{summary['missed']} missed; {served_rate:,.0f} req/s"
    return [
        Row("replay-memory", f"peak RSS, {count:,}-exchange tape loaded", loaded["VmHWM"], "MB",
            note=f"tape {size:,.0f} MB; {memory_parts(loaded)}"),
        Row("replay-memory", f"peak RSS after N = {count:,} requests", once["VmHWM"], "MB",
            once["VmHWM"] / loaded["VmHWM"], f"each exchange once; {memory_parts(once)}"),
        Row("replay-memory", f"peak RSS after 3N = {3 * count:,} requests", thrice["VmHWM"],
            "MB", thrice["VmHWM"] / once["VmHWM"],
            f"{growth:+.1f} MB from N: {aim(flat, 'flat (within 1%)')}; {memory_parts(thrice)}"),
        Row("replay-memory", "answered from the tape", summary["requests"], "requests",
            note=checks),
    ]  # fmt: skip


def memory_status(pid: int) -> dict[str, float]:
    """VmHWM, VmRSS, RssAnon and RssFile of process `pid`, in MB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                values[name] = int(rest.split()[0]) * 1024 / MB
    return values


def memory_parts(status: dict[str, float]) -> str:
    return (
        f"now {status['VmRSS']:,.0f} MB: {status['RssAnon']:,.0f} heap (anon), "
        f"{status['RssFile']:,.0f} file (tape mmap, code)"
    )


# -- replay-profile: where the replay server's time goes (run it with --only) --------------------
#
# Three views, all of base-URL replay unless named: what matching one request costs in-process
# (no network); the CPU per request of three servers under the same load (the raw client, 16
# connections): the bare server, the replay server answering one fixed exchange (its HTTP
# layer alone) and the replay server as `serve` builds it; then cProfile's view of the last,
# in base-URL and in proxy mode (benchlib/profile_replay.py).


@section("replay-profile", default=False)
def replay_profile(run: Run) -> list[Row]:
    """Where the replay server's time per request goes."""
    lab = replay_lab(run)
    seconds = 2.0 if run.quick else 6.0
    rows = lookup_rows(lab)
    body_file = run.workdir / "answer.json"
    answer = load_tape(lab.tape).exchanges[0].response
    assert answer is not None and answer.body is not None
    body_file.write_bytes(answer.body)
    layers = (
        ("bare asyncio + httptools, fixed answer", None),
        ("ReplayServer, one fixed exchange, no matching", ["--fixed"]),
        ("ReplayServer + Replayer, as wiretape serve", []),
    )
    floor = 0.0
    for label, options in layers:
        if options is None:
            service = start_bare_server("bare", run.workdir, body_file)
        else:
            service = start_harness(run, lab, "layer", reverse=True, options=options)
        try:
            target = Target("layer", replay_address(service), lab.origin, None, False, service.pid)
            window = load_window(target, seconds)
        finally:
            service.stop()
        cost = proxy_cpu(window) * MS
        floor = floor or cost
        rows.append(Row("replay-profile", f"CPU per request: {label}", cost, "µs", cost / floor,
                        f"{cost - floor:+.0f} µs over the bare server; {window.rate:,.0f} req/s "
                        "at C=16 (raw client)"))  # fmt: skip
    for mode in ("replay-reverse", "replay-proxy"):
        stats = run.workdir / f"{mode}.pstats"
        reverse = mode == "replay-reverse"
        service = start_harness(run, lab, mode, reverse=reverse, options=["--stats", str(stats)])
        try:
            trust = None if reverse else lab.proxy_trust()
            target = Target(mode, replay_address(service), lab.origin, trust, not reverse,
                            service.pid)  # fmt: skip
            window = load_window(target, seconds)
        finally:
            service.stop()
        rows += profile_rows(mode, stats, window)
    return rows


def lookup_rows(lab: ReplayLab) -> list[Row]:
    """What matching costs per request, in-process, on the request the bench sends."""
    headers = [tuple(header.split(": ", 1)) for header in CHAT_HEADERS]
    headers += [("host", "127.0.0.1:8080"), ("content-length", str(len(REPLAY_BODY)))]
    request = Request("POST", lab.url + REPLAY_PATH, "HTTP/1.1", headers, REPLAY_BODY)  # type: ignore[arg-type]
    redactor = Redactor(load_or_create_key(lab.home))
    replayer = Replayer(lab.tape, redactor, allow_repeats=True)
    rules = MatchRules()
    try:
        costs = {
            "Replayer.lookup, all of it": timed(lambda: replayer.lookup(request)),
            "  of which: Redactor.request": timed(lambda: redactor.request(request)),
            "  of which: match_key": timed(lambda: match_key(request, rules)),
        }
    finally:
        replayer.close()
    return [
        Row("replay-profile", f"in-process: {name}", cost * US, "µs",
            note="per request, best of 3 x 20,000, no network")
        for name, cost in costs.items()
    ]  # fmt: skip


def timed(action: Callable[[], object], number: int = 20_000) -> float:
    """Seconds per call: the best of three runs of `number` calls."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(number):
            action()
        best = min(best, (time.perf_counter() - started) / number)
    return best


def start_harness(run: Run, lab: ReplayLab, name: str, *, reverse: bool, options: list[str]):
    argv = [sys.executable, str(ROOT / "scripts" / "benchlib" / "profile_replay.py"),
            str(lab.tape), "--home", str(lab.home), *options]  # fmt: skip
    if reverse:
        argv += ["--reverse", lab.url]
    env = dict(os.environ, WIRETAPE_HOME=str(lab.home))
    return Service(f"harness-{name}", argv, run.workdir / f"harness-{name}.log", env)


def load_window(target: Target, seconds: float) -> Window:
    """The raw client at C=16 for `seconds`, after half a second's warm-up."""
    connections = [dial(target) for _ in range(16)]
    request = target.request("POST", REPLAY_PATH, REPLAY_BODY, CHAT_HEADERS)
    try:
        drive(connections, request, 0.5)
        return drive(connections, request, seconds, target.pid)
    finally:
        for connection in connections:
            connection.close()


def profile_rows(mode: str, stats_path: Path, window: Window) -> list[Row]:
    stats = pstats.Stats(str(stats_path))
    own: dict[tuple[str, str], float] = defaultdict(float)  # (file, function): own seconds
    for (file, _, function), entry in stats.stats.items():  # type: ignore[attr-defined]
        own[profile_name(file, function)] += entry[2]
    idle = sum(t for (_, function), t in own.items() if "'poll' of 'select.epoll" in function)
    busy = sum(own.values()) - idle
    label = REPLAY_LABELS[mode]
    rows = [Row("replay-profile", f"{label}: profiled", window.rate, "req/s",
                note=f"{window.requests:,} requests; {busy / window.requests * US:.0f} µs "
                "of profiled CPU per request (cProfile slows it down; waiting in epoll left "
                "out)")]  # fmt: skip
    by_file: dict[str, float] = defaultdict(float)
    for (file, function), tottime in own.items():
        if "'poll' of 'select.epoll" not in function:
            by_file[file] += tottime
    for file, tottime in sorted(by_file.items(), key=lambda item: -item[1])[:10]:
        rows.append(Row("replay-profile", f"{label}: {file}", 100 * tottime / busy, "%",
                        note="own time of its functions, share of busy time"))  # fmt: skip
    ranked = [item for item in own.items() if "'poll' of 'select.epoll" not in item[0][1]]
    for (file, function), tottime in sorted(ranked, key=lambda item: -item[1])[:20]:
        share = 100 * tottime / busy
        note = f"{tottime / window.requests * US:.1f} µs/req own time"
        rows.append(Row("replay-profile", f"{label}: {file}:{function}", share, "%", note=note))
    return rows


def profile_name(file: str, function: str) -> tuple[str, str]:
    """A profiled function's file, shortened to a name a reader knows, and its name."""
    if file == "~":
        return "(built-in)", function
    path = Path(file)
    for folder, package in ((ROOT / "proxy", "wiretape"), (ROOT / "tapes", "wiretape/tapes")):
        if path.is_relative_to(folder):
            return f"{package}/{path.relative_to(folder)}", function
    for anchor in ("site-packages", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        if anchor in path.parts:
            at = len(path.parts) - 1 - path.parts[::-1].index(anchor)
            return "/".join(path.parts[at + 1 :]), function
    return path.name, function


# -- running and reporting ---------------------------------------------------------------------


def run_sections(names: list[str], quick: bool) -> list[Row]:
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="wiretape-bench-shared-") as shared_dir,
        contextlib.ExitStack() as resources,
    ):
        shared = Shared(Path(shared_dir), resources)
        for name in names:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix=f"wiretape-bench-{name}-") as workdir:
                rows += SECTIONS[name](Run(quick=quick, workdir=Path(workdir), shared=shared))
            took = time.perf_counter() - started
            print(f"bench: {name} took {took:.1f} s", file=sys.stderr, flush=True)
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
        help=f"run only this section (repeatable): {', '.join(SECTIONS)}; all but "
        f"{', '.join(sorted(set(SECTIONS) - set(DEFAULT_SECTIONS)))} run by default",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or DEFAULT_SECTIONS
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows = run_sections(names, args.quick)
    print(format_table(rows))
    args.json.write_text(json.dumps(results_document(rows, names, args.quick, started), indent=2))
    print(f"\nresults written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
