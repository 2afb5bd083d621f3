"""A client the end-to-end tests run directly and under wiretape: `pyclient.py SCENARIO URL`.

Prints what the client library made of the answers, one JSON line per result, so a run
direct and a run through wiretape can be compared line for line. Secrets come from the
environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, PLANTED_SECRET) as a real agent's would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


def emit(**fields: object) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


def openai_client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", max_retries=0)


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def openai_chat(url: str) -> None:
    reply = openai_client(url).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    emit(kind="chat", content=reply.choices[0].message.content, id=reply.id)


def openai_stream(url: str) -> None:
    stream = openai_client(url).chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    )
    emit(kind="stream", pieces=[c.choices[0].delta.content for c in stream if c.choices])


def openai_tools(url: str) -> None:
    reply = openai_client(url).chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, tools=[WEATHER_TOOL]
    )
    call = reply.choices[0].message.tool_calls[0]
    emit(kind="tool", name=call.function.name, arguments=call.function.arguments)


def openai_async_stream(url: str) -> None:
    import openai

    async def one(client: openai.AsyncOpenAI, n: int) -> list[str | None]:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"question {n}"}],
            stream=True,
        )
        return [c.choices[0].delta.content async for c in stream if c.choices]

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", max_retries=0) as client:
            answers = await asyncio.gather(*(one(client, n) for n in range(4)))
        for n, pieces in enumerate(answers):
            emit(kind="async-stream", n=n, text="".join(p or "" for p in pieces))

    asyncio.run(main())


def openai_responses(url: str) -> None:
    client = openai_client(url)
    reply = client.responses.create(model="gpt-4o-mini", input="Say hello")
    emit(kind="responses", text=reply.output_text)
    with client.responses.stream(model="gpt-4o-mini", input="Stream hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    emit(kind="responses-stream", deltas=deltas)


def anthropic_stream(url: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=url, max_retries=0)
    reply = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=100,
        messages=[{"role": "user", "content": "Hello Claude"}],
    )
    emit(kind="messages", text=reply.content[0].text)
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=100,
        messages=[{"role": "user", "content": "Stream to me"}],
    ) as stream:
        emit(kind="messages-stream", pieces=list(stream.text_stream))


def httpx_sse(url: str) -> None:
    import httpx

    with (
        httpx.Client() as client,
        client.stream("GET", f"{url}/fake/sse", params={"events": 5}) as response,
    ):
        body = b"".join(response.iter_raw()).decode()
        emit(kind="sse", status=response.status_code, body=body)


def requests_json(url: str) -> None:
    import requests

    secret = os.environ.get("PLANTED_SECRET", "")
    with requests.Session() as session:
        answer = session.get(f"{url}/fake/json", params={"size": 2000}, timeout=10)
        emit(kind="json", status=answer.status_code, size=len(answer.content))
        echo = session.post(
            f"{url}/fake/echo",
            params={"api_key": secret, "q": "weather"},
            json={"note": f"my key is {secret}"},
            headers={"x-api-key": secret},
            timeout=10,
        )
        emit(kind="echo", status=echo.status_code, method=echo.json()["method"])


SCENARIOS = {
    "openai-chat": openai_chat,
    "openai-stream": openai_stream,
    "openai-tools": openai_tools,
    "openai-async-stream": openai_async_stream,
    "openai-responses": openai_responses,
    "anthropic": anthropic_stream,
    "httpx-sse": httpx_sse,
    "requests-json": requests_json,
}

if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    SCENARIOS[scenario](url)
