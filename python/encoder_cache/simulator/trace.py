"""Traces: an operator's own traffic as JSON lines, read as a stream.

One request per line, in arrival order::

    {"t": 12.5, "session": "user-7", "prompt_tokens": 310, "output_tokens": 128,
     "items": [{"id": "sha256:...", "embeds": 1024}, ...]}

- ``t``: arrival in seconds (non-decreasing down the file); the step is
  ``floor(t / step_seconds)``.
- ``session``: a conversation id, or null. A request of a session whose prompt
  begins with the session's previous request (its items at the same places)
  shares that prefix token for token, so the prefix cache can serve it.
- ``prompt_tokens``: text tokens, not counting the items' placeholders. Each
  item adds ``embeds`` placeholder tokens plus one start and one end token.
- ``output_tokens``: tokens the request decodes (at least 1).
- ``items``: in prompt order; ``id`` is the item's content hash (the cache key),
  ``embeds`` its encoder embeddings. Optional per item: ``modality`` (default
  "image") and ``offset`` (the first placeholder's token index; all items or
  none). Without offsets the items come first, then all the text.
- Optional: ``id`` (the request id; default ``line<N>``) and ``think``
  (seconds): the request arrives ``think`` seconds after the session's
  previous request finished, but not before ``t`` (a closed-loop chat turn).

A bad line stops the run before it starts with the file, line number and field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from encoder_cache.simulator.workloads import Item, RequestSpec

__all__ = ["TraceError", "TraceWorkload", "parse_line", "write_trace"]


class TraceError(ValueError):
    """A trace line that cannot be replayed: names the file, line and field."""


def _fail(path: str, line: int, name: str, message: str) -> TraceError:
    return TraceError(f"{path}:{line}: field '{name}': {message}")


def _int(value: Any, path: str, line: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise _fail(path, line, name, f"expected an integer, got {json.dumps(value)}")
    if value < minimum:
        raise _fail(path, line, name, f"must be >= {minimum}, got {value}")
    return value


def _seconds(value: Any, path: str, line: int, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, line, name, f"expected a number of seconds, got {json.dumps(value)}")
    if not math.isfinite(value) or value < 0:
        raise _fail(path, line, name, f"must be a finite number >= 0, got {value}")
    return float(value)


_FIELDS = {"t", "session", "prompt_tokens", "output_tokens", "items", "think", "id"}
_ITEM_FIELDS = {"id", "embeds", "offset", "modality"}


def parse_line(text: str, path: str, line: int, step_seconds: float) -> tuple[float, RequestSpec]:
    """``(t, spec)`` for one trace line; TraceError naming the field if it is bad."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{line}: not a JSON object: {exc.msg}") from None
    if not isinstance(record, dict):
        raise TraceError(f"{path}:{line}: not a JSON object")
    unknown = sorted(set(record) - _FIELDS)
    if unknown:
        raise _fail(path, line, unknown[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    for name in ("t", "prompt_tokens", "output_tokens", "items"):
        if name not in record:
            raise _fail(path, line, name, "missing")
    t = _seconds(record["t"], path, line, "t")
    session = record.get("session")
    if session is not None:
        if isinstance(session, bool) or not isinstance(session, (str, int)):
            raise _fail(path, line, "session", f"expected a string, an integer or null, got {json.dumps(session)}")
        session = str(session)
    text_tokens = _int(record["prompt_tokens"], path, line, "prompt_tokens", 0)
    output = _int(record["output_tokens"], path, line, "output_tokens", 1)
    think = None
    if record.get("think") is not None:
        if session is None:
            raise _fail(path, line, "think", "needs a session (think is the time since the session's last answer)")
        think = int(_seconds(record["think"], path, line, "think") / step_seconds + 1e-6)
    request_id = record.get("id", f"line{line}")
    if not isinstance(request_id, str) or not request_id:
        raise _fail(path, line, "id", f"expected a non-empty string, got {json.dumps(request_id)}")
    raw_items = record["items"]
    if not isinstance(raw_items, list):
        raise _fail(path, line, "items", f"expected a list, got {json.dumps(raw_items)}")
    parsed: list[tuple[str, int, int | None, str]] = []
    for index, raw in enumerate(raw_items):
        where = f"items[{index}]"
        if not isinstance(raw, dict):
            raise _fail(path, line, where, "expected an object with 'id' and 'embeds'")
        unknown = sorted(set(raw) - _ITEM_FIELDS)
        if unknown:
            raise _fail(path, line, f"{where}.{unknown[0]}", "unknown field (known: embeds, id, modality, offset)")
        for name in ("id", "embeds"):
            if name not in raw:
                raise _fail(path, line, f"{where}.{name}", "missing")
        identifier = raw["id"]
        if isinstance(identifier, bool) or not isinstance(identifier, (str, int)) or identifier == "":
            raise _fail(path, line, f"{where}.id", f"expected a non-empty string, got {json.dumps(identifier)}")
        embeds = _int(raw["embeds"], path, line, f"{where}.embeds", 1)
        offset = raw.get("offset")
        if offset is not None:
            offset = _int(offset, path, line, f"{where}.offset", 1)
        modality = raw.get("modality", "image")
        if not isinstance(modality, str) or not modality:
            raise _fail(path, line, f"{where}.modality", f"expected a non-empty string, got {json.dumps(modality)}")
        parsed.append((str(identifier), embeds, offset, modality))
    with_offsets = sum(p[2] is not None for p in parsed)
    if with_offsets not in (0, len(parsed)):
        first = next(i for i, p in enumerate(parsed) if p[2] is None)
        raise _fail(path, line, f"items[{first}].offset", "missing: give every item an offset or none")
    length = text_tokens + sum(embeds + 2 for _, embeds, _, _ in parsed)
    items: list[Item] = []
    position = 0  # the first token after the previous item's end token
    for index, (identifier, embeds, offset, modality) in enumerate(parsed):
        if offset is None:
            offset = position + 1
        elif offset < position + 1:
            raise _fail(
                path,
                line,
                f"items[{index}].offset",
                f"{offset} overlaps the previous item or its wrapper tokens (the earliest is {position + 1})",
            )
        items.append(Item(identifier, offset, embeds, modality))
        position = offset + embeds + 1
    if position > length:
        raise _fail(
            path,
            line,
            "prompt_tokens",
            f"{text_tokens} text tokens leave no room for the items at their offsets "
            f"(the last ends at token {position}, the prompt has {length})",
        )
    arrival = int(t / step_seconds + 1e-6)
    return t, RequestSpec(request_id, arrival, session, think, length, output, tuple(items))


@dataclass
class _Scan:
    requests: int = 0
    max_embeds: dict[str, int] = field(default_factory=dict)
    max_tokens: int = 0
    distinct_items: int = 0


class TraceWorkload:
    """A trace file, validated once up front and then streamed line by line on each replay."""

    def __init__(self, path: str, step_seconds: float) -> None:
        self.path = path
        self.step_seconds = step_seconds
        self.scan = _Scan()
        ids: set[str] = set()
        for spec in self._read():
            self.scan.requests += 1
            self.scan.max_tokens = max(self.scan.max_tokens, spec.total_tokens)
            for item in spec.items:
                if self.scan.max_embeds.get(item.modality, 0) < item.length:
                    self.scan.max_embeds[item.modality] = item.length
            if spec.request_id in ids:
                raise TraceError(f"{path}:{self.scan.requests}: field 'id': {spec.request_id!r} is used twice")
            if len(ids) < 2_000_000:  # duplicate ids are checked over the first two million requests
                ids.add(spec.request_id)
        if not self.scan.requests:
            raise TraceError(f"{path}: no requests in the trace")

    def _read(self) -> Iterator[RequestSpec]:
        last_t = 0.0
        with open(self.path, encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                t, spec = parse_line(text, self.path, number, self.step_seconds)
                if t < last_t:
                    raise _fail(self.path, number, "t", f"{t} is earlier than the line before ({last_t}): sort by t")
                last_t = t
                yield spec

    def requests(self) -> Iterator[RequestSpec]:
        return self._read()

    @property
    def num_requests(self) -> int:
        return self.scan.requests

    def max_embeds_per_item(self) -> dict[str, int]:
        return dict(self.scan.max_embeds)

    def describe(self) -> str:
        return (
            f"trace {os.path.basename(self.path)}: {self.scan.requests:,} requests, "
            f"{self.step_seconds * 1000:g} ms per step"
        )


def spec_record(spec: RequestSpec, step_seconds: float) -> dict[str, Any]:
    """The trace line for ``spec`` (offsets written, so the layout replays exactly)."""
    text_tokens = spec.prompt_tokens - sum(item.length + 2 for item in spec.items)
    record: dict[str, Any] = {
        "t": round(spec.arrival * step_seconds, 9),
        "session": spec.session,
        "prompt_tokens": text_tokens,
        "output_tokens": spec.output_tokens,
        "items": [
            {"id": item.identifier, "embeds": item.length, "offset": item.offset, "modality": item.modality}
            for item in spec.items
        ],
        "id": spec.request_id,
    }
    if spec.think is not None:
        record["think"] = round(spec.think * step_seconds, 9)
    return record


def write_trace(specs: Iterable[RequestSpec], out: TextIO, step_seconds: float) -> int:
    """Write ``specs`` as trace lines; returns how many."""
    count = 0
    for spec in specs:
        out.write(json.dumps(spec_record(spec, step_seconds), separators=(",", ":")) + "\n")
        count += 1
    return count
