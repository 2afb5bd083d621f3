"""A small tool-using agent for the demo: `python -m wiretape.example_agent`.

It speaks the OpenAI chat completions API over plain httpx, as many agents do: ask a
question with a tool, run the tool call it gets back, send the result, and stream the final
answer. Nothing in it knows about wiretape: the demo records and replays it from outside.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def get_weather(city: str) -> str:
    return f"Sunny and 21 degrees in {city}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    )
    parser.add_argument("--system-prompt", default="You are a concise travel assistant.")
    parser.add_argument("--question", default="What is the weather in Lisbon?")
    parser.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args(argv)
    headers = {"authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'sk-no-key')}"}
    messages = [
        {"role": "system", "content": args.system_prompt},
        {"role": "user", "content": args.question},
    ]
    with httpx.Client(base_url=args.base_url, headers=headers, timeout=60) as client:
        first = client.post(
            "/chat/completions",
            json={"model": args.model, "messages": messages, "tools": [WEATHER_TOOL]},
        )
        if first.status_code != 200:
            print(
                f"agent: the model API answered {first.status_code}: {first.text}", file=sys.stderr
            )
            return 1
        message = first.json()["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            arguments = json.loads(call["function"]["arguments"])
            result = get_weather(**arguments)
            print(f"agent: tool {call['function']['name']}({arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        answer = []
        body = {"model": args.model, "messages": messages, "stream": True}
        with client.stream("POST", "/chat/completions", json=body) as stream:
            if stream.status_code != 200:
                print(f"agent: the model API answered {stream.status_code}", file=sys.stderr)
                return 1
            for line in stream.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    answer.append(delta.get("content") or "")
    print(f"agent: {''.join(answer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
