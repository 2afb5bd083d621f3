"""The bench's fake upstream: wiretape's fake LLM upstream over TLS, with a request counter.

Run as a script (`python upstream.py --cert-dir DIR`), it prints `listening on URL` and
`ca PATH`, then serves until SIGTERM. On SIGUSR1 it prints `requests N`, the requests it has
read so far: that is how the bench proves that a replaying mode never reached the upstream.
It is `wiretape.fake_upstream`'s server, run the way its own `main()` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from wiretape.fake_upstream import FakeUpstream
from wiretape.replay_server import loop_factory


async def serve(cert_dir: str) -> None:
    upstream = FakeUpstream(tls=True, cert_dir=cert_dir, keep_requests=False)
    await upstream.start()
    print(f"listening on {upstream.url}", flush=True)
    print(f"ca {upstream.ca_path}", flush=True)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: print(f"requests {upstream.request_count}", flush=True)
    )
    try:
        await stopping.wait()
    finally:
        await upstream.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert-dir", required=True, help="where the throwaway CA goes")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # uvloop where installed
        runner.run(serve(args.cert_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
