"""The floor of Python HTTP serving: asyncio and httptools answering every request with one
fixed response, with nothing else to do. What replay could reach if it cost nothing.

Run as a script: `python bare_server.py --body-file F [--echo]` prints its URL and serves
until SIGTERM. With `--echo` it is a plain TCP echo server instead (one blocking thread, no
HTTP), for timing a loopback round trip between two processes.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys

import httptools


class Fixed(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.write(self.answer)


async def serve_http(body: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    answer = head % len(body) + body
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Fixed(answer), "127.0.0.1", 0, backlog=1024)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    await stopping.wait()
    server.close()


def serve_echo() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-file", help="the body of every answer")
    parser.add_argument("--echo", action="store_true", help="a TCP echo server instead")
    args = parser.parse_args()
    if args.echo:
        serve_echo()
        return 0
    with open(args.body_file, "rb") as file:
        body = file.read()
    asyncio.run(serve_http(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
