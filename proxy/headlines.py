"""One line a person understands at once: what changed between a recorded request and a new one.

Knows the request shapes of OpenAI chat completions and Responses, Anthropic messages and
Gemini generateContent; anything else falls back to the first differing JSON path.
"""

from __future__ import annotations

import re
from typing import Any

from .fielddiff import FieldDiff

_INDEX = re.compile(r"^(\w+)\[(\d+)\]")


def headline(diffs: list[FieldDiff], recorded: Any, new: Any) -> str:
    """Summarise `diffs` between the parsed JSON bodies `recorded` and `new` (or None)."""
    if not diffs:
        return "identical request repeated more often than recorded"
    phrases: list[str] = []
    for diff in diffs:
        phrase = _phrase(diff, recorded, new)
        if phrase not in phrases:
            phrases.append(phrase)
    shown = "; ".join(phrases[:3])
    return shown + (f" (and {len(phrases) - 3} more)" if len(phrases) > 3 else "")


def _phrase(diff: FieldDiff, recorded: Any, new: Any) -> str:
    path = diff.path
    if path in ("method", "origin", "path"):
        return {
            "method": "method changed",
            "origin": "upstream changed",
            "path": "URL path changed",
        }[path]
    if path.startswith(("query.", "headers.")):
        kind, name = path.split(".", 1)
        return f"{'query parameter' if kind == 'query' else 'header'} {name} {diff.change}"
    top = path.split(".", 1)[0].split("[", 1)[0]
    if top in ("system", "instructions", "systemInstruction", "system_instruction"):
        return "system prompt changed"
    if top == "model":
        return "model changed"
    if top == "tools":
        return _tool_phrase(diff, recorded, new)
    if top in ("messages", "input", "contents"):
        return _message_phrase(diff, top, recorded, new)
    return f"{top} {diff.change}" if top == path else f"{path} {diff.change}"


def _message_phrase(diff: FieldDiff, top: str, recorded: Any, new: Any) -> str:
    match = _INDEX.match(diff.path)
    if match is None:  # e.g. Responses `input` as a plain string
        return "input changed" if top == "input" else f"{top} changed"
    index = int(match.group(2))
    number = index + 1
    if diff.path == match.group(0) and diff.change != "changed":
        return f"message {number} {diff.change}"
    role = _role(recorded, top, index) or _role(new, top, index)
    if role in ("system", "developer"):
        return "system prompt changed"
    return f"message {number} ({role}) changed" if role else f"message {number} changed"


def _tool_phrase(diff: FieldDiff, recorded: Any, new: Any) -> str:
    match = _INDEX.match(diff.path)
    if match is None:
        return f"tools {diff.change}"
    index = int(match.group(2))
    old_tools, new_tools = _tools(recorded), _tools(new)
    old_name = old_tools[index][0] if index < len(old_tools) else None
    new_name = new_tools[index][0] if index < len(new_tools) else None
    if old_name != new_name:
        old_names = {name for name, _ in old_tools}
        new_names = {name for name, _ in new_tools}
        if new_name is not None and new_name not in old_names:
            return f"tool {new_name} added"
        if old_name is not None and old_name not in new_names:
            return f"tool {old_name} removed"
        return "tools reordered"
    rest = diff.path[match.end() :]
    for part, label in (
        ("parameters", "parameters"),
        ("input_schema", "parameters"),
        ("description", "description"),
    ):
        if f".{part}" in rest:
            return f"tool {old_name}: {label} changed"
    return f"tool {old_name} changed"


def _tools(body: Any) -> list[tuple[str, Any]]:
    """(name, definition) of each tool in an OpenAI chat/Responses, Anthropic or Gemini body."""
    tools = body.get("tools") if isinstance(body, dict) else None
    named = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            named.append(("?", tool))
        elif isinstance(tool.get("function"), dict):  # OpenAI chat
            named.append((str(tool["function"].get("name")), tool))
        elif isinstance(tool.get("functionDeclarations"), list):  # Gemini
            names = [str(d.get("name")) for d in tool["functionDeclarations"]]
            named.append((",".join(names), tool))
        else:  # OpenAI Responses, Anthropic
            named.append((str(tool.get("name", tool.get("type", "?"))), tool))
    return named


def _role(body: Any, top: str, index: int) -> str | None:
    items = body.get(top) if isinstance(body, dict) else None
    if isinstance(items, list) and index < len(items) and isinstance(items[index], dict):
        role = items[index].get("role")
        return str(role) if role is not None else items[index].get("type")
    return None
