"""A request's tokens: their identity for prefix caching, and concrete
token ids for a real scheduler.

A request's tokens (prompt and answer) are described by *runs*
``(start, end, key, first)``: token ``p`` in ``[start, end)`` is token
``first + p - start`` of content ``key``, or, with ``first < 0``, the one
token of ``key`` (an item's placeholders). Keys: ``("t", key)`` shared text,
``("u", request, index)`` a request's own text, ``("o", request)`` its answer,
``("s"|"p"|"e", modality)`` an item's start, placeholder and end tokens, and
``("r", request)`` positional-format tokens (at their absolute positions).
Two spans of tokens are equal exactly when their runs are (runs are merged
where they continue each other), so the prefix cache compares blocks by runs
(``prefix_cache.BlockHasher``) and ``materialize`` turns the same runs into
token ids: both engines see the same prompts.

Requests in the positional trace format (no segments: a text-token count and
items at offsets) keep their meaning: their tokens are their own, except a
session turn's prefix shared with its previous turn (``shared_prefix``), whose
tokens are that turn's at the same positions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from encoder_cache.simulator.spec import Answer, Item, ItemSegment, RequestSpec

#: ``(start, end, key, first)``: see the module doc.
Run = tuple[int, int, Any, int]

__all__ = ["Materialized", "Prompts", "Run", "materialize", "segment_runs", "shared_prefix", "token_ids"]


def _text_key(key: Any) -> Any:
    return ("u", *key) if isinstance(key, tuple) else ("t", key)


def _append(runs: list[Run], start: int, end: int, key: Any, first: int) -> None:
    if end <= start:
        return
    if runs:
        s, e, k, f = runs[-1]
        continues = (f < 0 and first < 0) or (f >= 0 and f + e - s == first)
        if k == key and e == start and continues:
            runs[-1] = (s, end, k, f)
            return
    runs.append((start, end, key, first))


def segment_runs(spec: RequestSpec) -> list[Run]:
    """The runs of a request described by segments, its answer included."""
    runs: list[Run] = []
    position = 0
    for s in spec.segments or ():
        if isinstance(s, ItemSegment):
            _append(runs, position, position + 1, ("s", s.modality), 0)
            _append(runs, position + 1, position + 1 + s.embeds, ("p", s.modality), -1)
            position += s.embeds + 1
            _append(runs, position, position + 1, ("e", s.modality), 0)
            position += 1
        elif isinstance(s, Answer):
            _append(runs, position, position + s.tokens, ("o", s.request_id), 0)
            position += s.tokens
        else:
            _append(runs, position, position + s.tokens, _text_key(s.key), 0)
            position += s.tokens
    _append(runs, position, position + spec.output_tokens, ("o", spec.request_id), 0)
    return runs


def shared_prefix(previous: RequestSpec, spec: RequestSpec) -> int:
    """How many leading tokens ``spec`` shares with ``previous``'s prompt and
    answer (positional format): up to the shorter of the two, cut before the
    first item that is not at the same place in both."""
    limit = min(previous.total_tokens, spec.prompt_tokens)
    a_items, b_items = previous.items, spec.items
    j = 0
    while True:
        a = a_items[j] if j < len(a_items) and a_items[j].offset < limit else None
        b = b_items[j] if j < len(b_items) and b_items[j].offset < limit else None
        if a is None and b is None:
            return limit
        if a != b:
            return max(0, min(x.offset - 1 for x in (a, b) if x is not None))
        j += 1


class Prompts:
    """The runs of each request of one replay, asked in arrival order: it
    keeps each session's last request in the positional format, whose prompt
    is the next turn's prefix."""

    def __init__(self) -> None:
        self.last_turn: dict[str, tuple[RequestSpec, list[Run]]] = {}

    def runs(self, spec: RequestSpec) -> list[Run]:
        if spec.segments is not None:
            return segment_runs(spec)
        total = spec.total_tokens
        runs: list[Run] = [(0, total, ("r", spec.request_id), 0)]
        if spec.session is not None:
            last = self.last_turn.get(spec.session)
            if last is not None:
                shared = shared_prefix(last[0], spec)
                if shared:
                    runs = [(s, min(e, shared), k, f) for s, e, k, f in last[1] if s < shared]
                    _append(runs, shared, total, ("r", spec.request_id), shared)
            self.last_turn[spec.session] = (spec, runs)
        return runs


# Concrete token ids


#: Token ids below this are left to a tokenizer's special tokens.
FIRST_ID = 1000
_MASK = (1 << 64) - 1


def _seed(key: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def token_ids(key: Any, first: int, count: int, vocab_size: int) -> np.ndarray:
    """Tokens ``first .. first + count`` of content ``key`` (``first < 0``:
    ``count`` copies of its one token), as ids in ``[FIRST_ID, vocab_size)``.
    Deterministic: the same key gives the same ids in every process."""
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocab_size must be > {FIRST_ID}, got {vocab_size}")
    seed = np.uint64(_seed(key))
    index = np.zeros(count, dtype=np.uint64) if first < 0 else np.arange(first, first + count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # splitmix64, wrapping arithmetic
        z = index * np.uint64(0x9E3779B97F4A7C15) + seed
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (FIRST_ID + z % np.uint64(vocab_size - FIRST_ID)).astype(np.int64)


@dataclass(frozen=True)
class Materialized:
    """A request as concrete tokens: what a real scheduler is given."""

    request_id: str
    prompt_token_ids: list[int]
    #: The tokens it decodes, in order (a fake model emits exactly these).
    output_token_ids: list[int]
    #: Its items, in prompt order, with their placeholder ranges.
    items: tuple[Item, ...]


def materialize(spec: RequestSpec, runs: list[Run], vocab_size: int = 151_936) -> Materialized:
    """The token ids of ``spec`` whose runs (``Prompts.runs``) are ``runs``."""
    ids = np.concatenate(
        [token_ids(key, first, end - start, vocab_size) for start, end, key, first in runs]
        or [np.zeros(0, dtype=np.int64)]
    ).tolist()
    return Materialized(spec.request_id, ids[: spec.prompt_tokens], ids[spec.prompt_tokens :], spec.items)
