"""An in-process client for the bench: httpx, straight to the upstream or replayed by VCR.py.

VCR.py replays inside the client's own process, so there is no proxy process to measure: this
process is client and replayer at once. It runs as a subprocess of the bench, so that its CPU
is its own, and is driven over stdin and stdout, one JSON line each way:

    {"c": 16, "seconds": 2.0}  ->  {"requests": N, "seconds": S, "latencies": [...], "cpu": T}

C threads each keep one httpx.Client (a keep-alive connection) and one request in flight
until the window ends. `--mode record` makes one request through VCR.py, which writes the
cassette, and exits; `--mode replay` then serves every request from that cassette
(`record_mode="none"`, so a request with no recording fails instead of going out, and
`allow_playback_repeats`, so one recorded answer serves them all); `--mode direct` is the
same client with no VCR.py: the reference for the replay.

Run as a script: `python vcr_client.py --mode replay --url URL --ca CA --body-file F
--cassette C`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time

import httpx

# The headers the raw-socket client sends, less those httpx writes itself.
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json",
    "authorization": "Bearer sk-proj-Bench0Key0Not0Real0000000000000000000000000000",
    "user-agent": "wiretape-bench",
}
# What VCR.py compares: its defaults plus the body, as wiretape and mitmdump compare it.
MATCH_ON = ("method", "scheme", "host", "port", "path", "query", "body")


class Load:
    """C threads, each with an httpx.Client of its own, kept from one window to the next so
    that a warm-up window leaves their connections open for the timed one."""

    def __init__(self, url: str, ca: str, body: bytes) -> None:
        self.url = url
        self.ca = ca
        self.body = body
        self.clients: list[httpx.Client] = []

    def window(self, c: int, seconds: float) -> dict:
        while len(self.clients) < c:
            self.clients.append(httpx.Client(verify=self.ca, timeout=15.0))
        latencies: list[list[float]] = [[] for _ in range(c)]
        failures: list[str] = []
        gate = threading.Barrier(c + 1)
        deadline = 0.0

        def work(index: int) -> None:
            client, mine = self.clients[index], latencies[index]
            gate.wait()
            try:
                while True:
                    sent = time.perf_counter()
                    response = client.post(self.url, content=self.body, headers=HEADERS)
                    data = response.content
                    done = time.perf_counter()
                    if response.status_code != 200 or not data:
                        failures.append(f"status {response.status_code}: {data[:200]!r}")
                        return
                    mine.append(done - sent)
                    if done >= deadline:
                        return
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(c)]
        for thread in threads:
            thread.start()
        cpu_before = time.process_time()  # every thread of this process
        started = time.perf_counter()
        deadline = started + seconds
        gate.wait()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_before
        merged = sorted(latency for mine in latencies for latency in mine)
        return {
            "requests": len(merged),
            "seconds": elapsed,
            "latencies": merged,
            "cpu": cpu,
            "failures": failures[:3],
        }

    def close(self) -> None:
        for client in self.clients:
            client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("record", "replay", "direct"), required=True)
    parser.add_argument("--url", required=True, help="the upstream URL requested")
    parser.add_argument("--ca", required=True, help="the upstream's CA")
    parser.add_argument("--body-file", required=True, help="the request body")
    parser.add_argument("--cassette", help="VCR.py's cassette (record and replay)")
    args = parser.parse_args()
    with open(args.body_file, "rb") as file:
        body = file.read()

    with contextlib.ExitStack() as stack:
        if args.mode != "direct":
            import vcr

            cassette = vcr.VCR(
                record_mode="once" if args.mode == "record" else "none", match_on=MATCH_ON
            )
            stack.enter_context(cassette.use_cassette(args.cassette, allow_playback_repeats=True))
        if args.mode == "record":
            with httpx.Client(verify=args.ca) as client:
                response = client.post(args.url, content=body, headers=HEADERS)
                response.raise_for_status()
            return 0
        load = Load(args.url, args.ca, body)
        stack.callback(load.close)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("quit"):
                break
            print(json.dumps(load.window(command["c"], command["seconds"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
