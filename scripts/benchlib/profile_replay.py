"""The replay server in-process, as `wiretape serve --allow-repeats --quiet` builds it, for
taking it apart: optionally under cProfile, optionally without the Replayer.

The same pieces `wiretape serve` puts together (a Redactor with the home's key, a Replayer on
the tape, a ReplayServer whose handler asks it) on asyncio's loop, as `serve` runs them. With
`--fixed` the handler answers every request with the tape's first exchange and matches
nothing, which leaves the cost of the HTTP layer alone. With `--stats OUT` cProfile runs from
the first request to SIGTERM and its pstats are written to OUT. The load comes from another
process (the bench). Prints the URL first, like `wiretape serve`.

Run as a script: `python profile_replay.py TAPE --home DIR [--reverse URL] [--fixed]
[--stats OUT]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import signal
import sys
from pathlib import Path

from wiretape.matching import MatchRules
from wiretape.redact import Redactor, load_or_create_key
from wiretape.replay import Replayer
from wiretape.replay_server import ReplayServer
from wiretape.tapes import Exchange, Request, load_tape


async def serve(args: argparse.Namespace, profile: cProfile.Profile | None) -> None:
    replayer = Replayer(
        args.tape, Redactor(load_or_create_key(args.home)), MatchRules(), allow_repeats=True
    )
    fixed = load_tape(args.tape).exchanges[0]

    async def answer(request: Request) -> Exchange:  # replay_session's handler, --quiet
        return replayer.lookup(request)

    async def answer_fixed(request: Request) -> Exchange:
        return fixed

    handler = answer_fixed if args.fixed else answer
    server = ReplayServer(handler, home=args.home, host="127.0.0.1", port=0, reverse=args.reverse)
    await server.start()
    server.prepare_tls()
    print(server.url, flush=True)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    if profile is not None:
        profile.enable()
    try:
        await stopping.wait()
    finally:
        if profile is not None:
            profile.disable()
        await server.stop()
        replayer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tape", type=Path)
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--reverse")
    parser.add_argument("--fixed", action="store_true", help="answer without matching")
    parser.add_argument("--stats", type=Path, help="profile, and write pstats here")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.stats else None
    asyncio.run(serve(args, profile))
    if profile is not None:
        profile.dump_stats(args.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
