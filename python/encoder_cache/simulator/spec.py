"""What a request is: its timing, its session, its prompt (described by
content, or positionally) and its items' placeholder ranges.

A prompt described by content is a sequence of *segments*:

- ``Text(key, tokens)``: ``tokens`` tokens of the content named ``key``; the
  same key always means the same tokens (a deployment's system prompt is one
  key, shared by every request). Text that belongs to one request only has
  the key ``(request_id, index)`` (``own_text`` assigns it).
- ``ItemSegment(identifier, embeds, modality)``: a multimodal item, laid out
  as the modality's start token, ``embeds`` placeholder tokens and the
  modality's end token (the same wrapper tokens for every item of a modality,
  as chat templates make them).
- ``Answer(request_id, tokens)``: the tokens a request decoded; a chat turn's
  prompt holds its previous turn's prompt and answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Item", "ItemSegment", "RequestSpec", "Segment", "Text", "layout", "own_text"]


@dataclass(frozen=True)
class Item:
    identifier: str
    offset: int
    length: int
    modality: str


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    #: The step it arrives at, or for a continued session turn the earliest.
    arrival: int
    #: Chat session it belongs to, or None.
    session: str | None
    #: Steps after the session's previous request finished (None: open loop).
    think: int | None
    #: Whole prompt length in tokens: text, wrapper tokens and placeholders.
    prompt_tokens: int
    output_tokens: int
    items: tuple[Item, ...]  # sorted by offset
    #: The prompt described by content (``prompts.Segment``s, the whole
    #: prompt, a session's history included), or None for the positional
    #: format (its text belongs to this request, or to its session's earlier turn).
    segments: tuple[Any, ...] | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @classmethod
    def described(
        cls,
        request_id: str,
        arrival: int,
        session: str | None,
        think: int | None,
        segments: tuple[Segment, ...],
        output_tokens: int,
    ) -> RequestSpec:
        """A request whose whole prompt is ``segments``."""
        length, items = layout(segments)
        return cls(request_id, arrival, session, think, length, output_tokens, items, segments)


@dataclass(frozen=True)
class Text:
    #: A content key (str), or ``(request_id, index)`` for text of one request only.
    key: Any
    tokens: int


@dataclass(frozen=True)
class ItemSegment:
    identifier: str
    embeds: int
    modality: str = "image"


@dataclass(frozen=True)
class Answer:
    request_id: str
    tokens: int


Segment = Text | ItemSegment | Answer


def own_text(request_id: str, segments: Iterable[Segment]) -> tuple[Segment, ...]:
    """``segments`` with each keyless ``Text`` (key None) given the key
    ``(request_id, index)``, ``index`` its place among ``segments``."""
    return tuple(
        Text((request_id, i), s.tokens) if isinstance(s, Text) and s.key is None else s for i, s in enumerate(segments)
    )


def layout(segments: Sequence[Segment]) -> tuple[int, tuple[Item, ...]]:
    """``(prompt_tokens, items)``: the prompt's length and its items' placeholder ranges."""
    position = 0
    items: list[Item] = []
    for s in segments:
        if isinstance(s, ItemSegment):
            items.append(Item(s.identifier, position + 1, s.embeds, s.modality))
            position += s.embeds + 2
        else:
            position += s.tokens
    return position, tuple(items)
