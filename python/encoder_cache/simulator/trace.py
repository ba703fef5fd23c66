"""Traces: an operator's own traffic as JSON lines, read as a stream.

One request per line, in arrival order. A prompt is described by content::

    {"t": 12.5, "session": "user-7", "output_tokens": 128,
     "prompt": [{"text": "system-v3", "tokens": 512},
                {"id": "sha256:...", "embeds": 1024, "modality": "image"},
                {"tokens": 40}]}

- ``prompt``: segments in order. ``{"text": KEY, "tokens": N}`` is N tokens of
  the content KEY (the same key means the same tokens, in every request);
  ``{"tokens": N}`` is text of this request only; ``{"id", "embeds",
  "modality"}`` is an item (``id`` its content hash, the cache key; modality
  default "image"), wrapped in its modality's start and end tokens. In a
  session, a request's prompt is its previous request's prompt and answer,
  then the segments of its line.

or positionally (the format before content keys; it keeps its meaning)::

    {"t": 12.5, "session": "user-7", "prompt_tokens": 310, "output_tokens": 128,
     "items": [{"id": "sha256:...", "embeds": 1024}, ...]}

- ``prompt_tokens``: text tokens, not counting the items' placeholders. Each
  item adds ``embeds`` placeholder tokens plus one start and one end token.
  All of a request's text is its own, except that a session's request whose
  prompt begins with the session's previous request (its items at the same
  places) shares that prefix token for token.
- ``items``: in prompt order, ``id`` and ``embeds`` as above; optional per
  item: ``modality`` and ``offset`` (the first placeholder's token index; all
  items or none). Without offsets the items come first, then all the text.

Both formats:

- ``t``: arrival in seconds (non-decreasing down the file); the step is
  ``floor(t / step_seconds)``.
- ``session``: a conversation id, or null. A session's lines use one format.
- ``output_tokens``: tokens the request decodes (at least 1).
- Optional: ``id`` (the request id; default ``line<N>``) and ``think``
  (seconds): the request arrives ``think`` seconds after the session's
  previous request finished, but not before ``t`` (a closed-loop chat turn).

An item ``id`` always has the same ``embeds``. A bad line stops the run
before it starts with the file, line number and field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from encoder_cache.simulator.spec import Answer, Item, ItemSegment, RequestSpec, Segment, Text, own_text

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


_FIELDS = {"t", "session", "prompt", "prompt_tokens", "output_tokens", "items", "think", "id"}
_ITEM_FIELDS = {"id", "embeds", "offset", "modality"}
_SEGMENT_FIELDS = {"id", "embeds", "modality", "text", "tokens"}


def _identifier(value: Any, path: str, line: int, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise _fail(path, line, where, f"expected a non-empty string, got {json.dumps(value)}")
    return str(value)


def _modality(raw: dict[str, Any], path: str, line: int, where: str) -> str:
    modality = raw.get("modality", "image")
    if not isinstance(modality, str) or not modality:
        raise _fail(path, line, where, f"expected a non-empty string, got {json.dumps(modality)}")
    return modality


def _segments(raw_prompt: Any, path: str, line: int) -> list[Segment]:
    """The segments of a ``prompt`` field (keyless text stays keyless: ``own_text`` keys it)."""
    if not isinstance(raw_prompt, list):
        raise _fail(path, line, "prompt", f"expected a list of segments, got {json.dumps(raw_prompt)}")
    segments: list[Segment] = []
    for index, raw in enumerate(raw_prompt):
        where = f"prompt[{index}]"
        if not isinstance(raw, dict):
            raise _fail(path, line, where, 'expected {"text": KEY, "tokens": N}, {"tokens": N} or an item')
        unknown = sorted(set(raw) - _SEGMENT_FIELDS)
        if unknown:
            raise _fail(
                path, line, f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(_SEGMENT_FIELDS))})"
            )
        if "id" in raw or "embeds" in raw:
            mixed = sorted(set(raw) & {"text", "tokens"})
            if mixed:
                raise _fail(
                    path, line, f"{where}.{mixed[0]}", "an item has id, embeds and modality, not text or tokens"
                )
            for name in ("id", "embeds"):
                if name not in raw:
                    raise _fail(path, line, f"{where}.{name}", "missing")
            identifier = _identifier(raw["id"], path, line, f"{where}.id")
            embeds = _int(raw["embeds"], path, line, f"{where}.embeds", 1)
            segments.append(ItemSegment(identifier, embeds, _modality(raw, path, line, f"{where}.modality")))
            continue
        if "modality" in raw:
            raise _fail(path, line, f"{where}.modality", "only an item (id, embeds) has a modality")
        if "tokens" not in raw:
            raise _fail(path, line, f"{where}.tokens", "missing")
        tokens = _int(raw["tokens"], path, line, f"{where}.tokens", 1)
        key = raw.get("text")
        if key is not None and (not isinstance(key, str) or not key):
            raise _fail(path, line, f"{where}.text", f"expected a non-empty content key, got {json.dumps(key)}")
        segments.append(Text(key, tokens))
    return segments


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
    described = "prompt" in record
    if described:
        both = sorted(set(record) & {"prompt_tokens", "items"})
        if both:
            raise _fail(path, line, both[0], "give a prompt of segments, or prompt_tokens and items, not both")
    required = ("t", "output_tokens", "prompt") if described else ("t", "prompt_tokens", "output_tokens", "items")
    for name in required:
        if name not in record:
            raise _fail(path, line, name, "missing")
    t = _seconds(record["t"], path, line, "t")
    session = record.get("session")
    if session is not None:
        if isinstance(session, bool) or not isinstance(session, (str, int)):
            raise _fail(path, line, "session", f"expected a string, an integer or null, got {json.dumps(session)}")
        session = str(session)
    output = _int(record["output_tokens"], path, line, "output_tokens", 1)
    think = None
    if record.get("think") is not None:
        if session is None:
            raise _fail(path, line, "think", "needs a session (think is the time since the session's last answer)")
        think = int(_seconds(record["think"], path, line, "think") / step_seconds + 1e-6)
    request_id = record.get("id", f"line{line}")
    if not isinstance(request_id, str) or not request_id:
        raise _fail(path, line, "id", f"expected a non-empty string, got {json.dumps(request_id)}")
    arrival = int(t / step_seconds + 1e-6)
    if described:
        segments = own_text(request_id, _segments(record["prompt"], path, line))
        return t, RequestSpec.described(request_id, arrival, session, think, segments, output)
    text_tokens = _int(record["prompt_tokens"], path, line, "prompt_tokens", 0)
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
        identifier = _identifier(raw["id"], path, line, f"{where}.id")
        embeds = _int(raw["embeds"], path, line, f"{where}.embeds", 1)
        offset = raw.get("offset")
        if offset is not None:
            offset = _int(offset, path, line, f"{where}.offset", 1)
        parsed.append((identifier, embeds, offset, _modality(raw, path, line, f"{where}.modality")))
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
    return t, RequestSpec(request_id, arrival, session, think, length, output, tuple(items))


@dataclass
class _Scan:
    requests: int = 0
    max_embeds: dict[str, int] = field(default_factory=dict)
    max_tokens: int = 0
    #: Every item id seen: its embeddings and the line that first gave them (during validation).
    embeds: dict[str, tuple[int, int]] = field(default_factory=dict)


class _Turns:
    """Each session's last request, as the next line of the session extends it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.last: dict[str, RequestSpec] = {}

    def extend(self, spec: RequestSpec, line: int) -> RequestSpec:
        """``spec`` with its session's history before its own segments."""
        session = spec.session
        if session is None:
            return spec
        previous = self.last.get(session)
        if previous is not None and (previous.segments is None) != (spec.segments is None):
            raise TraceError(
                f"{self.path}:{line}: field 'prompt': session {spec.session!r} mixes the two formats "
                "(a prompt of segments, and prompt_tokens with items): write its lines in one"
            )
        if previous is not None and spec.segments is not None:
            assert previous.segments is not None
            history = (*previous.segments, Answer(previous.request_id, previous.output_tokens))
            spec = RequestSpec.described(
                spec.request_id, spec.arrival, spec.session, spec.think, history + spec.segments, spec.output_tokens
            )
        self.last[session] = spec
        return spec


class TraceWorkload:
    """A trace file, validated once up front and then streamed line by line on each replay."""

    def __init__(self, path: str, step_seconds: float) -> None:
        self.path = path
        self.step_seconds = step_seconds
        self.scan = _Scan()
        ids: set[str] = set()
        embeds = self.scan.embeds
        for number, spec in self._read():
            self.scan.requests += 1
            self.scan.max_tokens = max(self.scan.max_tokens, spec.total_tokens)
            for item in spec.items:
                if self.scan.max_embeds.get(item.modality, 0) < item.length:
                    self.scan.max_embeds[item.modality] = item.length
                first = embeds.setdefault(item.identifier, (item.length, number))
                if first[0] != item.length:
                    raise TraceError(
                        f"{path}:{number}: item {item.identifier!r} has {item.length} embeds here but "
                        f"{first[0]} on line {first[1]}: one id is one item, always the same size"
                    )
            if spec.request_id in ids:
                raise TraceError(f"{path}:{number}: field 'id': {spec.request_id!r} is used twice")
            if len(ids) < 2_000_000:  # duplicate ids are checked over the first two million requests
                ids.add(spec.request_id)
        if not self.scan.requests:
            raise TraceError(f"{path}: no requests in the trace")
        embeds.clear()  # only validation needs it; the workload is copied to every worker process

    def _read(self) -> Iterator[tuple[int, RequestSpec]]:
        last_t = 0.0
        turns = _Turns(self.path)
        with open(self.path, encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                t, spec = parse_line(text, self.path, number, self.step_seconds)
                if t < last_t:
                    raise _fail(self.path, number, "t", f"{t} is earlier than the line before ({last_t}): sort by t")
                last_t = t
                yield number, turns.extend(spec, number)

    def requests(self) -> Iterator[RequestSpec]:
        return (spec for _, spec in self._read())

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


def _segment_record(segment: Segment, request_id: str, index: int) -> dict[str, Any]:
    if isinstance(segment, ItemSegment):
        return {"id": segment.identifier, "embeds": segment.embeds, "modality": segment.modality}
    if isinstance(segment, Text):
        if segment.key == (request_id, index):
            return {"tokens": segment.tokens}
        if isinstance(segment.key, str):
            return {"text": segment.key, "tokens": segment.tokens}
    raise ValueError(f"request {request_id}: segment {index} ({segment}) cannot be written to a trace line")


def spec_record(spec: RequestSpec, step_seconds: float, previous: tuple[str, int, int] | None = None) -> dict[str, Any]:
    """The trace line for ``spec``; ``previous`` is its session's previous
    request (id, output tokens, prompt segments), whose prompt and answer its
    prompt extends. Positional requests are written with offsets, so the
    layout replays exactly."""
    record: dict[str, Any] = {"t": round(spec.arrival * step_seconds, 9), "session": spec.session}
    if spec.segments is not None:
        own = spec.segments
        if previous is not None:
            request_id, output_tokens, length = previous
            if spec.segments[length : length + 1] != (Answer(request_id, output_tokens),):
                raise ValueError(
                    f"request {spec.request_id}: its prompt does not extend its session's previous request"
                )
            own = spec.segments[length + 1 :]
        record["output_tokens"] = spec.output_tokens
        record["prompt"] = [_segment_record(s, spec.request_id, i) for i, s in enumerate(own)]
    else:
        record["prompt_tokens"] = spec.prompt_tokens - sum(item.length + 2 for item in spec.items)
        record["output_tokens"] = spec.output_tokens
        record["items"] = [
            {"id": item.identifier, "embeds": item.length, "offset": item.offset, "modality": item.modality}
            for item in spec.items
        ]
    record["id"] = spec.request_id
    if spec.think is not None:
        record["think"] = round(spec.think * step_seconds, 9)
    return record


def write_trace(specs: Iterable[RequestSpec], out: TextIO, step_seconds: float) -> int:
    """Write ``specs`` as trace lines; returns how many."""
    count = 0
    last: dict[str, tuple[str, int, int]] = {}  # session -> its last request's (id, output tokens, segments)
    for spec in specs:
        previous = None if spec.session is None else last.get(spec.session)
        out.write(json.dumps(spec_record(spec, step_seconds, previous), separators=(",", ":")) + "\n")
        if spec.session is not None and spec.segments is not None:
            last[spec.session] = (spec.request_id, spec.output_tokens, len(spec.segments))
        count += 1
    return count
