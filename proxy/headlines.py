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
    old_tools, new_tools = _tools(recorded), _tools(new)
    prefixes = [p for p in {*old_tools, *new_tools} if _under(diff.path, p)]
    if not prefixes:
        return f"tools {diff.change}"
    prefix = max(prefixes, key=len)
    old_name, new_name = old_tools.get(prefix), new_tools.get(prefix)
    if old_name != new_name:
        if new_name is not None and new_name not in old_tools.values():
            return f"tool {new_name} added"
        if old_name is not None and old_name not in new_tools.values():
            return f"tool {old_name} removed"
        return "tools reordered"
    rest = diff.path[len(prefix) :]
    for part, label in (
        ("parameters", "parameters"),
        ("input_schema", "parameters"),
        ("description", "description"),
    ):
        if f".{part}" in rest:
            return f"tool {old_name}: {label} changed"
    return f"tool {old_name} changed"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


def _tools(body: Any) -> dict[str, str]:
    """Each tool's JSON path and name, in an OpenAI chat or Responses, Anthropic or Gemini
    body. Gemini groups declarations in one tool: each declaration counts as a tool."""
    tools = body.get("tools") if isinstance(body, dict) else None
    named: dict[str, str] = {}
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            named[path] = "?"
        elif isinstance(tool.get("function"), dict):  # OpenAI chat
            named[path] = str(tool["function"].get("name"))
        elif isinstance(tool.get("functionDeclarations"), list):  # Gemini
            for position, declaration in enumerate(tool["functionDeclarations"]):
                name = declaration.get("name") if isinstance(declaration, dict) else "?"
                named[f"{path}.functionDeclarations[{position}]"] = str(name)
        else:  # OpenAI Responses, Anthropic
            named[path] = str(tool.get("name", tool.get("type", "?")))
    return named


def _role(body: Any, top: str, index: int) -> str | None:
    items = body.get(top) if isinstance(body, dict) else None
    if isinstance(items, list) and index < len(items) and isinstance(items[index], dict):
        role = items[index].get("role")
        return str(role) if role is not None else items[index].get("type")
    return None
