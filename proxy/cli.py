"""The `wiretape` command line. Commands import their machinery lazily to keep start-up fast."""

from __future__ import annotations

import sys
from typing import NoReturn
from urllib.parse import urlsplit

import click
import orjson

from .tapes import VERSION, TapeError, TapeReader, repair_tape, verify_tape
from .tapes.model import header_record, seal_record

# Exit codes are a contract (DESIGN.md): scripts and CI read them.
EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_SECRETS_FOUND = 1  # verify --secrets: a finding, like a divergence, fails the check
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
@click.option(
    "--secrets",
    "scan_secrets",
    is_flag=True,
    help="Also scan for anything still secret-shaped (API keys, tokens, JWTs): exit 1 if found.",
)
@click.option(
    "--redact",
    "redact_patterns",
    multiple=True,
    metavar="REGEX",
    help="With --secrets: also report what this regular expression matches (repeatable).",
)
def verify(
    tapes: tuple[str, ...], repair: bool, scan_secrets: bool, redact_patterns: tuple[str, ...]
) -> None:
    """Check that each TAPE is intact (hash chain unbroken) and sealed.

    Exits 0 when every tape is sound, 3 with one line per problem otherwise;
    with --secrets, 1 when a sound tape still holds something secret-shaped.
    """
    problems = leaks = 0
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
            if scan_secrets:
                leaks += _report_leaks(path, redact_patterns)
    if problems:
        sys.exit(EXIT_TAPE_INVALID)
    sys.exit(EXIT_SECRETS_FOUND if leaks else EXIT_OK)


def _report_leaks(path: str, patterns: tuple[str, ...]) -> int:
    from .leaks import find_leaks

    count = 0
    try:
        for leak in find_leaks(path, patterns):
            click.echo(f"secret: {leak.to_text(path)}", err=True)
            count += 1
    except ValueError as exc:  # a bad --redact pattern
        fail(str(exc))
    if not count:
        click.echo(f"ok: {path}: nothing secret-shaped")
    return count


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


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"expected HOST:PORT such as 127.0.0.1:8080, got {value!r}")
    return host, int(port)


def parse_reverse(url: str) -> str:
    """Check a `--reverse` upstream and return it as scheme://host[:port]."""
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ValueError(
            f"--reverse needs an http(s) URL such as https://api.openai.com, got {url!r}"
        )
    if split.path not in ("", "/") or split.query or split.fragment:
        raise ValueError(f"--reverse takes only scheme, host and port, got {url!r}")
    try:
        split.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ValueError(f"--reverse has an invalid port: {url!r}") from None
    return f"{split.scheme}://{split.netloc}"


def _listen_option(default: str):
    return click.option(
        "--listen",
        default=default,
        show_default=True,
        metavar="HOST:PORT",
        help="Address to listen on; port 0 picks a free one.",
    )


@main.command()
@click.argument("tape", type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_listen_option("127.0.0.1:0")
@click.option(
    "--reverse",
    metavar="URL",
    help="Base-URL mode: listen as plain HTTP and forward to this upstream, "
    "e.g. https://api.openai.com (clients set OPENAI_BASE_URL instead of a proxy).",
)
@click.option(
    "--upstream-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="Also trust this CA (PEM) for upstream connections.",
)
@click.option(
    "--upstream-insecure", is_flag=True, help="Do not verify upstream certificates (unsafe)."
)
@click.option(
    "--redact",
    "redact_patterns",
    multiple=True,
    metavar="REGEX",
    help="Also redact what this regular expression matches (repeatable).",
)
@click.option("--overwrite", is_flag=True, help="Replace TAPE if it exists.")
@click.option(
    "--fsync",
    type=click.Choice(["always", "batched", "never"]),
    default="batched",
    show_default=True,
    help="How often the tape is forced to disk: bounds what a power loss can take.",
)
@click.option("--quiet", "-q", is_flag=True, help="No line per exchange on stderr.")
def record(
    tape: str,
    command: tuple[str, ...],
    listen: str,
    reverse: str | None,
    upstream_ca: str | None,
    upstream_insecure: bool,
    redact_patterns: tuple[str, ...],
    overwrite: bool,
    fsync: str,
    quiet: bool,
) -> None:
    """Record HTTP(S) traffic to TAPE.

    \b
    With -- COMMAND ARGS...: run COMMAND through the proxy, then seal TAPE and
    exit with COMMAND's exit code. Without: record until Ctrl-C or SIGTERM.

    \b
    Examples:
      wiretape record tapes/run.tape -- python agent.py
      wiretape record tapes/run.tape --reverse https://api.openai.com
    """
    from pathlib import Path

    from .record_session import record_session
    from .recording import RecordingConfig

    host, port = _parse_listen(listen)
    if reverse is not None:
        try:
            reverse = parse_reverse(reverse)
        except ValueError as exc:
            fail(str(exc))
    if command:
        _check_command(command[0])
    if upstream_insecure:
        click.echo(
            "wiretape: WARNING: --upstream-insecure: upstream certificates are NOT verified; "
            "anyone on the path can read and change this traffic",
            err=True,
        )
    config = RecordingConfig(
        tape=Path(tape),
        home=_home(),
        listen_host=host,
        listen_port=port,
        reverse=reverse,
        upstream_ca=Path(upstream_ca) if upstream_ca else None,
        upstream_insecure=upstream_insecure,
        redact=list(redact_patterns),
        overwrite=overwrite,
        fsync=fsync,  # type: ignore[arg-type]
    )
    sys.exit(record_session(config, list(command), quiet=quiet))


@main.command()
def ca() -> None:
    """Print the path of wiretape's CA certificate (created on first use).

    Clients must trust it to be recorded over HTTPS; `record -- COMMAND` and
    `wiretape env` set that up. Its directory is $WIRETAPE_HOME (default ~/.wiretape).
    """
    from .home import ca_cert_path

    click.echo(ca_cert_path(_home()))


@main.command()
@_listen_option("127.0.0.1:8080")
@click.option(
    "--reverse",
    metavar="URL",
    help="Base-URL mode: the upstream a `--reverse` wiretape forwards to.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["sh", "fish", "dotenv", "json"]),
    default="sh",
    show_default=True,
)
def env(listen: str, reverse: str | None, fmt: str) -> None:
    """Print the variables that route a shell's processes through a running wiretape.

    \b
    eval "$(wiretape env --listen 127.0.0.1:8080)"

    Proxy mode also puts the client shims in place (PYTHONPATH, NODE_OPTIONS,
    NODE_USE_ENV_PROXY). sh and fish put them before the shell's own PYTHONPATH and
    NODE_OPTIONS; dotenv and json print final values, joined to the ones this command sees.
    """
    from .client_shims.environment import format_environment, wiretape_variables

    host, port = _parse_listen(listen)
    variables = wiretape_variables(f"http://{_url_host(host)}:{port}", reverse, _home())
    click.echo(format_environment(variables, fmt), nl=False)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _home():
    from .home import wiretape_home

    try:
        return wiretape_home()
    except OSError as exc:
        fail(f"cannot use WIRETAPE_HOME: {exc}")


def _check_command(name: str) -> None:
    import shutil

    if shutil.which(name) is None:
        fail(f"command not found: {name}")


def _parse_pace(value: str) -> float | None:
    if value == "fast":
        return None
    if value == "recorded":
        return 1.0
    try:
        factor = float(value)
    except ValueError:
        factor = -1.0
    if not factor > 0:
        raise click.BadParameter(f"expected fast, recorded or a positive factor, got {value!r}")
    return factor


def _replay_options(listen_default: str):
    """The options `replay` and `serve` share."""
    options = [
        _listen_option(listen_default),
        click.option(
            "--reverse",
            metavar="URL",
            help="Base-URL mode: origin-form requests mean this upstream, e.g. "
            "https://api.openai.com (proxy-mode requests are served too).",
        ),
        click.option(
            "--pace",
            default="fast",
            show_default=True,
            metavar="fast|recorded|FACTOR",
            help="fast: no waiting; recorded: the recorded timing; a factor scales it "
            "(0.5 = half the recorded waits).",
        ),
        click.option(
            "--on-miss",
            type=click.Choice(["error", "forward"]),
            default="error",
            show_default=True,
            help="error: answer an unrecorded request with a 404 SDKs do not retry; "
            "forward: send it upstream and record it with --record-new.",
        ),
        click.option(
            "--record-new",
            type=click.Path(dir_okay=False),
            metavar="PATH",
            help="With --on-miss forward: the new tape that forwarded misses go to.",
        ),
        click.option(
            "--upstream-ca",
            type=click.Path(exists=True, dir_okay=False),
            help="With --on-miss forward: also trust this CA upstream.",
        ),
        click.option(
            "--ignore-header",
            multiple=True,
            metavar="NAME",
            help="Leave this request header out of matching (repeatable).",
        ),
        click.option(
            "--ignore-json-path",
            multiple=True,
            metavar="PATH",
            help="Leave this JSON body field out of matching, e.g. metadata.run_id or "
            "messages[*].id (repeatable).",
        ),
        click.option(
            "--strict-order",
            is_flag=True,
            help="Requests arriving in another order than recorded are a divergence.",
        ),
        click.option(
            "--allow-repeats",
            is_flag=True,
            help="Serve the last recorded answer again when an identical request comes "
            "more often than recorded (else it is a miss).",
        ),
        click.option(
            "--report",
            type=click.Path(dir_okay=False),
            metavar="PATH",
            help="Also write the divergence report as JSON to PATH.",
        ),
        click.option("--quiet", "-q", is_flag=True, help="No line per request on stderr."),
    ]

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def _replay_config(tape: str, **options):
    from pathlib import Path

    from .matching import MatchRules
    from .replay_session import ReplayConfig

    host, port = _parse_listen(options["listen"])
    reverse = options["reverse"]
    if reverse is not None:
        try:
            reverse = parse_reverse(reverse)
        except ValueError as exc:
            fail(str(exc))
    forward = options["on_miss"] == "forward"
    if forward != (options["record_new"] is not None):
        fail("--on-miss forward and --record-new PATH go together")
    try:
        rules = MatchRules.build(options["ignore_header"], options["ignore_json_path"])
    except ValueError as exc:
        fail(f"--ignore-json-path: {exc}")
    return ReplayConfig(
        tape=Path(tape),
        home=_home(),
        listen_host=host,
        listen_port=port,
        reverse=reverse,
        pace=_parse_pace(options["pace"]),
        rules=rules,
        strict_order=options["strict_order"],
        allow_repeats=options["allow_repeats"],
        record_new=Path(options["record_new"]) if options["record_new"] else None,
        upstream_ca=Path(options["upstream_ca"]) if options["upstream_ca"] else None,
        report=Path(options["report"]) if options["report"] else None,
        quiet=options["quiet"],
    )


@main.command()
@click.argument("tape", type=TAPE)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_replay_options("127.0.0.1:0")
def replay(tape: str, command: tuple[str, ...], **options) -> None:
    """Serve TAPE offline and run COMMAND against it: wiretape replay TAPE -- COMMAND ...

    COMMAND gets the same environment `record` gives it. Prints the divergence
    report; exits 1 on divergence, else with COMMAND's exit code (3 if TAPE is invalid).
    """
    from .replay_session import replay_session

    config = _replay_config(tape, **options)
    _check_command(command[0])
    sys.exit(replay_session(config, list(command)))


@main.command()
@click.argument("tape", type=TAPE)
@_replay_options("127.0.0.1:8080")
def serve(tape: str, **options) -> None:
    """Serve TAPE offline until Ctrl-C or SIGTERM, then print the divergence report.

    The first line on stdout is the address served (so --listen 127.0.0.1:0 works
    from scripts). Exits 1 if the requests diverged from the tape, 3 if TAPE is invalid.
    """
    from .replay_session import replay_session

    sys.exit(replay_session(_replay_config(tape, **options), []))


@main.command()
@click.argument("recorded", type=TAPE)
@click.argument("new", type=TAPE)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--ignore-header", multiple=True, metavar="NAME", help="As for replay.")
@click.option("--ignore-json-path", multiple=True, metavar="PATH", help="As for replay.")
@click.option("--strict-order", is_flag=True, help="As for replay.")
def diff(
    recorded: str,
    new: str,
    as_json: bool,
    ignore_header: tuple[str, ...],
    ignore_json_path: tuple[str, ...],
    strict_order: bool,
) -> None:
    """Compare the request streams of two tapes: where NEW parts from RECORDED, and how.

    Exits 0 when identical, 1 when they diverge, 3 when a tape is invalid.
    """
    from .compare import compare_tapes
    from .matching import MatchRules

    try:
        rules = MatchRules.build(ignore_header, ignore_json_path)
    except ValueError as exc:
        fail(f"--ignore-json-path: {exc}")
    try:
        report = compare_tapes(recorded, new, rules, _home(), strict_order=strict_order)
    except TapeError as exc:
        fail(str(exc), EXIT_TAPE_INVALID)
    if as_json:
        click.echo(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(report.to_text())
    sys.exit(EXIT_DIVERGED if report.diverged else EXIT_OK)


@main.command()
def demo() -> None:
    """Record a bundled example agent against a bundled fake LLM, replay it offline,
    then change its prompt and show the divergence report. No key, no network."""
    from .demo import run_demo

    sys.exit(run_demo())


@main.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the wiretape to check listens (record or serve --listen).",
)
def doctor(command: tuple[str, ...], listen: str) -> None:
    """Check that clients here can reach a running wiretape and trust its CA.

    \b
    One line per check: the CA and its bundle, the proxy at --listen, and
    whether python3, node and curl (those on PATH) trust wiretape's CA with the
    variables `wiretape env` sets. With -- COMMAND ARGS...: also run COMMAND with
    those variables and say which of its connections went through the proxy.
    Exits 0 when every check passes, 1 when something is missing.
    """
    from .doctor import run_doctor

    host, port = _parse_listen(listen)
    if command:
        _check_command(command[0])
    sys.exit(run_doctor(host, port, _home(), list(command), out=click.echo))


@main.group()
def shims() -> None:
    """The client shims that make clients use the proxy (see `wiretape env`).

    \b
    Python: a sitecustomize on PYTHONPATH makes aiohttp read the proxy variables.
    Node: a preload in NODE_OPTIONS routes fetch() and http/https through the
    proxy on Node 18 to 22 (Node 24 does it itself); fetch() needs undici, which
    `wiretape shims install node` installs from the npm registry.
    """


@shims.command("install")
@click.argument("runtime", type=click.Choice(["node"]))
def shims_install(runtime: str) -> None:
    """Install what a shim needs: for node, undici into $WIRETAPE_HOME/node.

    Runs `npm install --prefix $WIRETAPE_HOME/node undici@6`. Exits 1 if npm fails.
    """
    import os
    import shutil
    import subprocess

    from .client_shims.installs import installed_undici, npm_environment, npm_install_command

    npm = shutil.which("npm")
    if npm is None:
        fail("npm not found on PATH: install Node.js with npm, then run this again")
    home = _home()
    args = npm_install_command(npm, home)
    click.echo(f"wiretape: {' '.join(args)}", err=True)
    if subprocess.run(args, env=npm_environment(dict(os.environ))).returncode != 0:
        fail("npm could not install undici (its own message is above)", 1)
    click.echo(f"undici {installed_undici(home)} installed for the Node preload in {home / 'node'}")
