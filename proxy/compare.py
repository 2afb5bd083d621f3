"""`wiretape diff`: the replay matcher run over a second tape's request stream."""

from __future__ import annotations

from pathlib import Path

from .matching import MatchRules
from .redact import Redactor, load_or_create_key
from .replay import DivergenceReport, Replayer
from .tapes import TapeReader


def compare_tapes(
    recorded: str, new: str, rules: MatchRules, home: Path, *, strict_order: bool = False
) -> DivergenceReport:
    """Feed NEW's requests, in arrival order, to a replayer of RECORDED."""
    replayer = Replayer(
        recorded, Redactor(load_or_create_key(home)), rules, strict_order=strict_order
    )
    try:
        with TapeReader(new) as reader:
            requests = sorted(((e.seq, e.request) for e in reader), key=lambda pair: pair[0])
        for _, request in requests:
            replayer.lookup(request)
        report = replayer.report()
    finally:
        replayer.close()
    report.extra["new_tape"] = new
    first = report.misses[0].position if report.misses else None
    report.extra["first_divergence"] = first
    return report
