"""Field-level differences between a recorded request and a new one, as JSON paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .matching import MatchKey, parsed_body

ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "<absent>"})()
PREVIEW = 200  # characters of a long value shown in a report


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """`path` differs: `recorded` became `new`; ABSENT on one side means added or removed."""

    path: str
    recorded: Any
    new: Any

    @property
    def change(self) -> str:
        if self.recorded is ABSENT:
            return "added"
        if self.new is ABSENT:
            return "removed"
        return "changed"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "change": self.change,
            "recorded": None if self.recorded is ABSENT else self.recorded,
            "new": None if self.new is ABSENT else self.new,
        }

    def to_text(self) -> str:
        if self.change == "added":
            return f"{self.path}: added {preview(self.new)}"
        if self.change == "removed":
            return f"{self.path}: removed (was {preview(self.recorded)})"
        return f"{self.path}: {preview(self.recorded)} -> {preview(self.new)}"


def diff_keys(recorded: MatchKey, new: MatchKey) -> list[FieldDiff]:
    """Every field of the match keys that differs, the request line first, then the body."""
    diffs: list[FieldDiff] = []
    for name in ("method", "origin", "path"):
        if getattr(recorded, name) != getattr(new, name):
            diffs.append(FieldDiff(name, getattr(recorded, name), getattr(new, name)))
    diffs += _diff_pairs("query", recorded.query, new.query)
    diffs += _diff_pairs("headers", recorded.headers, new.headers)
    old_json, new_json = parsed_body(recorded), parsed_body(new)
    if old_json is not None and new_json is not None:
        diffs += diff_values(old_json, new_json)
    elif recorded.body != new.body:
        diffs.append(FieldDiff("body", _body_text(recorded.body), _body_text(new.body)))
    return diffs


def diff_values(recorded: Any, new: Any, path: str = "") -> list[FieldDiff]:
    """Leaf-level differences of two JSON values; list elements compare by position."""
    if isinstance(recorded, dict) and isinstance(new, dict):
        diffs = []
        for name in list(recorded) + [k for k in new if k not in recorded]:
            child = f"{path}.{name}" if path else name
            diffs += diff_values(recorded.get(name, ABSENT), new.get(name, ABSENT), child)
        return diffs
    if isinstance(recorded, list) and isinstance(new, list):
        diffs = []
        for index in range(max(len(recorded), len(new))):
            old_item = recorded[index] if index < len(recorded) else ABSENT
            new_item = new[index] if index < len(new) else ABSENT
            diffs += diff_values(old_item, new_item, f"{path}[{index}]")
        return diffs
    if recorded == new and type(recorded) is type(new):
        return []
    return [FieldDiff(path or "body", recorded, new)]


def preview(value: Any) -> str:
    """A value as a report shows it: strings quoted, JSON compact, long ones cut."""
    if value is ABSENT:
        return "<absent>"
    text = repr(value) if isinstance(value, str) else _json(value)
    return text if len(text) <= PREVIEW else text[:PREVIEW] + "…"


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _diff_pairs(prefix: str, recorded: tuple, new: tuple) -> list[FieldDiff]:
    old_map: dict[str, list[str]] = {}
    new_map: dict[str, list[str]] = {}
    for name, value in recorded:
        old_map.setdefault(name, []).append(value)
    for name, value in new:
        new_map.setdefault(name, []).append(value)
    diffs = []
    for name in list(old_map) + [n for n in new_map if n not in old_map]:
        old_values, new_values = old_map.get(name, ABSENT), new_map.get(name, ABSENT)
        if old_values != new_values:
            diffs.append(FieldDiff(f"{prefix}.{name}", _single(old_values), _single(new_values)))
    return diffs


def _single(values: Any) -> Any:
    return values[0] if isinstance(values, list) and len(values) == 1 else values


def _body_text(body: Any) -> Any:
    if isinstance(body, bytes):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(body)} bytes of binary>"
    return body
