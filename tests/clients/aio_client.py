"""An aiohttp client the end-to-end tests run through wiretape: `aio_client.py URL`.

aiohttp ignores HTTPS_PROXY unless a session is made with `trust_env=True`; this one is made
the way most code makes it, without, so only wiretape's sitecustomize shim routes it. Prints
one JSON line per result, so a recorded run and a replayed one compare line for line.
"""

import asyncio
import json
import sys

import aiohttp


def emit(**fields: object) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


async def main(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        emit(kind="trust_env", value=session.trust_env)
        async with session.post(
            f"{url}/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi aio"}]},
        ) as answer:
            reply = await answer.json()
            emit(
                kind="chat", status=answer.status, content=reply["choices"][0]["message"]["content"]
            )
        async with session.get(f"{url}/fake/sse", params={"events": "4"}) as answer:
            chunks = [chunk async for chunk in answer.content.iter_any()]
            emit(kind="sse", status=answer.status, body=b"".join(chunks).decode())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
