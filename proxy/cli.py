"""The `wiretape` command line. Commands import their machinery lazily to keep start-up fast."""

from __future__ import annotations

import sys
from typing import NoReturn

import click
import orjson

from .tapes import VERSION, TapeError, TapeReader, repair_tape, verify_tape
from .tapes.model import header_record, seal_record

# Exit codes are a contract (DESIGN.md): scripts and CI read them.
EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2
EXIT_TAPE_INVALID = 3

TAPE = click.Path(exists=True, dir_okay=False, readable=True)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"wiretape: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="wiretape")
def main() -> None:
    """Record and replay the HTTP traffic of AI agents.

    \b
    Exit codes: 0 success or identical, 1 divergence, 2 usage error,
    3 tape invalid (bad format, broken chain, truncated).
    """


@main.command()
@click.argument("tapes", nargs=-1, required=True, type=TAPE)
@click.option(
    "--repair",
    is_flag=True,
    help="Seal a crash-cut tape after its intact prefix; the end record says it was recovered.",
)
def verify(tapes: tuple[str, ...], repair: bool) -> None:
    """Check that each TAPE is intact (hash chain unbroken) and sealed.

    Exits 0 when every tape is sound, 3 with one line per problem otherwise.
    """
    problems = 0
    for path in tapes:
        try:
            if repair:
                repaired = repair_tape(path)
                if repaired is not None:
                    click.echo(
                        f"repaired: {path}: kept {repaired.exchanges} intact exchange(s), "
                        f"dropped {repaired.dropped_bytes} byte(s) of partial record; "
                        "sealed as recovered"
                    )
            summary = verify_tape(path)
        except TapeError as exc:
            click.echo(str(exc), err=True)
            problems += 1
        except OSError as exc:
            click.echo(f"{path}: cannot read: {exc.strerror}", err=True)
            problems += 1
        else:
            note = ", recovered by repair" if summary.seal.recovered else ""
            click.echo(f"ok: {path}: {summary.exchanges} exchange(s), sealed{note}")
    sys.exit(EXIT_TAPE_INVALID if problems else EXIT_OK)


@main.command()
@click.argument("tape", type=TAPE)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, for scripts.")
def inspect(tape: str, as_json: bool) -> None:
    """Show TAPE's header and a table of its exchanges.

    A damaged tape shows its intact part, then the problem, and exits 3.
    """
    from .summary import format_table, summarize

    summaries, problem, seal, header = [], None, None, None
    try:
        with TapeReader(tape) as reader:
            header = reader.header
            try:
                for exchange in reader:
                    summaries.append(summarize(exchange))
            finally:
                seal = reader.seal
    except TapeError as exc:
        problem = str(exc)
    except OSError as exc:
        fail(f"{tape}: cannot read: {exc.strerror}")
    summaries.sort(key=lambda s: s.seq)

    if as_json:
        document = {
            "path": tape,
            "header": None if header is None else header_record(header),
            "exchanges": [s.to_json() for s in summaries],
            "seal": None if seal is None else seal_record(seal),
            "problem": problem,
        }
        click.echo(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    else:
        if header is not None:
            click.echo(_header_text(tape, header, seal, len(summaries)))
            click.echo()
            click.echo(format_table(summaries))
    if problem:
        click.echo(problem, err=True)
        sys.exit(EXIT_TAPE_INVALID)


def _header_text(path: str, header, seal, count: int) -> str:
    if seal is None:
        state = "NOT SEALED"
    elif seal.recovered:
        state = f"sealed {seal.ended} (recovered by repair)"
    else:
        state = f"sealed {seal.ended}"
    lines = [
        f"tape:      {path}",
        f"format:    version {header.version}, {header.hash_algorithm} chain, "
        f"written by wiretape {header.wiretape}",
        f"created:   {header.created}",
        f"state:     {state}, {count} exchange(s)",
        f"redaction: {_redaction_text(header.redaction)}",
    ]
    return "\n".join(lines)


def _redaction_text(policy: dict) -> str:
    if not policy:
        return "none recorded"
    return ", ".join(
        f"{key}: {len(value)}" if isinstance(value, list) else f"{key}: {value}"
        for key, value in policy.items()
    )
