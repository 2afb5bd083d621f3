"""Measure wiretape's speed: each section times one part and adds rows to one table.

A section is a function of a `Run` that returns `Row`s, registered by name with `@section`.
Later sections (proxy latency, replay throughput) register themselves the same way.
`--quick` shrinks every section so that a whole run takes under a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from wiretape.tapes import (
    VERSION,
    Exchange,
    Request,
    Response,
    TapeWriter,
    Timings,
    verify_tape,
)
from wiretape.tapes.chain import GENESIS, chain_digest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench-results.json"
MB = 1_000_000


@dataclass(slots=True)
class Row:
    """One measurement. `ratio` is its cost relative to a reference (1.0 = as fast as it)."""

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


# -- running and reporting ---------------------------------------------------------------------


def run_sections(names: list[str], quick: bool) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"wiretape-bench-{name}-") as workdir:
            rows += SECTIONS[name](Run(quick=quick, workdir=Path(workdir)))
    return rows


def format_value(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.3g}" if value < 10 else f"{value:,.1f}"


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
