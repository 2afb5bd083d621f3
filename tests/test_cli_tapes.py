"""`wiretape verify` and `wiretape inspect`, run as a user runs them: the installed command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
from wiretape.tapes import (
    VERSION,
    Chunk,
    Exchange,
    Request,
    Response,
    TapeWriter,
    Timings,
    UpstreamError,
    load_tape,
    verify_tape,
)

WIRETAPE = Path(sys.executable).with_name("wiretape")
EXIT_OK, EXIT_USAGE, EXIT_TAPE_INVALID = 0, 2, 3


def wiretape(*args: object) -> subprocess.CompletedProcess[str]:
    assert WIRETAPE.exists(), f"the console script is not installed at {WIRETAPE}"
    command = [str(WIRETAPE), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def exchanges() -> list[Exchange]:
    listed = Exchange(
        seq=0,
        offset_us=1_000,
        request=Request("GET", "https://api.example.com/v1/models", "HTTP/1.1", [], b""),
        response=Response(200, "OK", "HTTP/1.1", [], body=b'{"data":[]}'),
        timings=Timings(headers_us=800, done_us=1_500),
    )
    streamed = Exchange(
        seq=1,
        offset_us=5_000,
        request=Request(
            "POST", "https://api.example.com/v1/chat/completions", "HTTP/1.1", [], b"{}"
        ),
        response=Response(
            200,
            "OK",
            "HTTP/1.1",
            [("content-type", "text/event-stream")],
            chunks=[Chunk(10, b"data: 1\n\n"), Chunk(20, b"data: 2\n\n"), Chunk(30, b"[DONE]")],
        ),
        timings=Timings(headers_us=5, done_us=412_300),
    )
    timed_out = Exchange(
        seq=2,
        offset_us=9_000,
        request=Request("GET", "https://tools.example.org/search?q=tape", "HTTP/1.1", [], b""),
        response=None,
        error=UpstreamError("timeout", "read timed out"),
    )
    return [listed, streamed, timed_out]


def write_tape(path: Path) -> Path:
    with TapeWriter(path, redaction={"headers": ["authorization"]}, fsync="never") as writer:
        for exchange in exchanges():
            writer.append(exchange)
    return path


def cut_tape(path: Path) -> tuple[Path, int]:
    """Cut the tape inside its third exchange line; return it and the bytes kept intact."""
    data = write_tape(path).read_bytes()
    lines = data.splitlines(keepends=True)
    intact = sum(len(line) for line in lines[:3])  # header and two exchanges
    path.write_bytes(data[: intact + 25])
    return path, intact


def tampered_tape(path: Path) -> Path:
    data = write_tape(path).read_bytes()
    path.write_bytes(data.replace(b"/v1/models", b"/v2/models"))
    return path


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stderr.strip().splitlines()


# -- verify ------------------------------------------------------------------------------------


def test_verify_reports_a_sound_tape_ok(tmp_path):
    tape = write_tape(tmp_path / "good.tape")
    result = wiretape("verify", tape)
    assert result.returncode == EXIT_OK
    assert result.stdout.strip() == f"ok: {tape}: 3 exchange(s), sealed"
    assert result.stderr == ""


def test_verify_names_the_file_and_line_of_a_broken_chain(tmp_path):
    tape = tampered_tape(tmp_path / "edited.tape")
    result = wiretape("verify", tape)
    assert result.returncode == EXIT_TAPE_INVALID
    assert result.stdout == ""
    [line] = error_lines(result)
    assert line.startswith(f"{tape}: line 2: broken hash chain")


def test_verify_names_the_file_and_line_of_a_cut(tmp_path):
    tape, _ = cut_tape(tmp_path / "cut.tape")
    result = wiretape("verify", tape)
    assert result.returncode == EXIT_TAPE_INVALID
    [line] = error_lines(result)
    assert line.startswith(f"{tape}: line 4: truncated")
    assert "2 intact exchanges" in line
    assert "--repair" in line


def test_verify_reports_a_file_that_is_not_a_tape(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("shopping list\neggs\n")
    result = wiretape("verify", other)
    assert result.returncode == EXIT_TAPE_INVALID
    [line] = error_lines(result)
    assert line == f"{other}: line 1: not a wiretape tape (no header record)"


def test_verify_of_several_tapes_reports_each_and_fails_for_the_one_bad(tmp_path):
    first = write_tape(tmp_path / "first.tape")
    bad = tampered_tape(tmp_path / "bad.tape")
    last = write_tape(tmp_path / "last.tape")
    result = wiretape("verify", first, bad, last)
    assert result.returncode == EXIT_TAPE_INVALID
    assert result.stdout.splitlines() == [
        f"ok: {first}: 3 exchange(s), sealed",
        f"ok: {last}: 3 exchange(s), sealed",
    ]
    [line] = error_lines(result)
    assert line.startswith(f"{bad}: line 2:")


def test_verify_repair_seals_a_cut_tape_keeping_its_intact_prefix(tmp_path):
    tape, intact = cut_tape(tmp_path / "cut.tape")
    prefix = tape.read_bytes()[:intact]
    result = wiretape("verify", "--repair", tape)
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.splitlines() == [
        f"repaired: {tape}: kept 2 intact exchange(s), dropped 25 byte(s) of partial record; "
        "sealed as recovered",
        f"ok: {tape}: 2 exchange(s), sealed, recovered by repair",
    ]
    assert tape.read_bytes()[:intact] == prefix
    assert verify_tape(tape).seal.recovered["dropped_bytes"] == 25
    assert load_tape(tape).exchanges == exchanges()[:2]
    assert wiretape("verify", tape).returncode == EXIT_OK


def test_verify_repair_leaves_a_sound_tape_alone(tmp_path):
    tape = write_tape(tmp_path / "good.tape")
    before = tape.read_bytes()
    result = wiretape("verify", "--repair", tape)
    assert result.returncode == EXIT_OK
    assert "repaired" not in result.stdout
    assert tape.read_bytes() == before


def test_verify_repair_refuses_to_seal_over_an_edit(tmp_path):
    tape = tampered_tape(tmp_path / "edited.tape")
    before = tape.read_bytes()
    result = wiretape("verify", "--repair", tape)
    assert result.returncode == EXIT_TAPE_INVALID
    assert "repaired" not in result.stdout
    assert "broken hash chain" in result.stderr
    assert tape.read_bytes() == before


def test_verify_of_a_missing_file_is_a_usage_error(tmp_path):
    result = wiretape("verify", tmp_path / "nowhere.tape")
    assert result.returncode == EXIT_USAGE
    assert "nowhere.tape" in result.stderr and "does not exist" in result.stderr


def test_verify_without_a_tape_is_a_usage_error():
    assert wiretape("verify").returncode == EXIT_USAGE


# -- inspect -----------------------------------------------------------------------------------


def test_inspect_tabulates_each_exchange(tmp_path):
    tape = write_tape(tmp_path / "good.tape")
    result = wiretape("inspect", tape)
    assert result.returncode == EXIT_OK, result.stderr
    out = result.stdout
    assert f"tape:      {tape}" in out
    assert "sealed" in out and "3 exchange(s)" in out and "NOT SEALED" not in out
    assert re.search(r"^SEQ\s+METHOD\s+HOST AND PATH\s+STATUS\b", out, re.M)
    assert re.search(r"^\s*0\s+GET\s+api\.example\.com/v1/models\s+200\s+1\.5ms\s", out, re.M)
    row = r"^\s*1\s+POST\s+api\.example\.com/v1/chat/completions\s+200\s+412\.3ms\s+3\s+24$"
    assert re.search(row, out, re.M)
    assert re.search(r"^\s*2\s+GET\s+tools\.example\.org/search\?q=tape\s+timeout\s", out, re.M)


def test_inspect_json_describes_header_and_exchanges(tmp_path):
    tape = write_tape(tmp_path / "good.tape")
    result = wiretape("inspect", "--json", tape)
    assert result.returncode == EXIT_OK, result.stderr
    document = orjson.loads(result.stdout)
    assert {"header", "exchanges", "seal", "problem"} <= document.keys()
    assert document["problem"] is None
    assert document["header"]["version"] == 1
    assert document["header"]["redaction"] == {"headers": ["authorization"]}
    assert document["seal"]["exchanges"] == 3
    listed, streamed, timed_out = document["exchanges"]
    assert listed["seq"] == 0 and listed["method"] == "GET"
    assert listed["url"] == "https://api.example.com/v1/models"
    assert (listed["status"], listed["duration_ms"], listed["chunks"]) == (200, 1.5, None)
    assert listed["response_bytes"] == len(b'{"data":[]}')
    assert (streamed["chunks"], streamed["response_bytes"], streamed["streamed"]) == (3, 24, True)
    assert streamed["duration_ms"] == 412.3
    assert (timed_out["status"], timed_out["error"]) == (None, "timeout")


def test_inspect_json_of_a_cut_tape_shows_the_intact_part_and_the_problem(tmp_path):
    tape, _ = cut_tape(tmp_path / "cut.tape")
    result = wiretape("inspect", "--json", tape)
    assert result.returncode == EXIT_TAPE_INVALID
    document = orjson.loads(result.stdout)
    assert [e["seq"] for e in document["exchanges"]] == [0, 1]
    assert document["seal"] is None
    assert document["problem"].startswith(f"{tape}: line 4: truncated")


def test_inspect_of_a_cut_tape_says_it_is_not_sealed(tmp_path):
    tape, _ = cut_tape(tmp_path / "cut.tape")
    result = wiretape("inspect", tape)
    assert result.returncode == EXIT_TAPE_INVALID
    assert "NOT SEALED, 2 exchange(s)" in result.stdout
    [line] = error_lines(result)
    assert line.startswith(f"{tape}: line 4: truncated")


def test_inspect_of_a_missing_file_is_a_usage_error(tmp_path):
    result = wiretape("inspect", tmp_path / "nowhere.tape")
    assert result.returncode == EXIT_USAGE


def test_inspect_shows_a_sound_tape_whatever_its_urls(tmp_path):
    tape = tmp_path / "odd.tape"
    request = Request("GET", "http://[oops/x", "HTTP/1.1", [], b"")
    with TapeWriter(tape, redaction={}, fsync="never") as writer:
        writer.append(Exchange(0, 0, request, None, UpstreamError("dns", "no such host")))
    assert wiretape("verify", tape).returncode == EXIT_OK
    assert wiretape("inspect", tape).returncode == EXIT_OK


# -- the command itself ------------------------------------------------------------------------


def test_version_prints_the_package_version():
    result = wiretape("--version")
    assert result.returncode == EXIT_OK
    assert result.stdout.strip() == f"wiretape, version {VERSION}"


def test_help_lists_the_tape_commands_and_exit_codes():
    result = wiretape("--help")
    assert result.returncode == EXIT_OK
    assert re.search(r"^\s+verify\s", result.stdout, re.M)
    assert re.search(r"^\s+inspect\s", result.stdout, re.M)
    assert "3 tape invalid" in result.stdout
    verify_help = wiretape("verify", "--help")
    assert verify_help.returncode == EXIT_OK and "--repair" in verify_help.stdout
