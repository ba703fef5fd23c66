"""The Rust step-level API reads an item's details (identifier, ``is_embed``
mask) only when a call first needs the item, and then once, and never calls
``get_num_embeds()``: in vLLM that runs a torch cumsum on a masked item, and
the embed count is the mask's true entries (or the length without one). Items
a prefix-cache hit covers are never scheduled at all."""

from __future__ import annotations

from typing import Any

import pytest
from step_helpers import ArrayPlaceholder, snapshot

import encoder_cache
from encoder_cache import Request

MANAGERS = [encoder_cache.EncoderCacheManager, encoder_cache.EncoderDecoderCacheManager]


class CountingPlaceholder(ArrayPlaceholder):
    """Counts reads of ``is_embed``; a poisoned one raises on any detail."""

    def __init__(self, offset: int, length: int, is_embed: Any = None, *, poisoned: bool = False) -> None:
        self.poisoned = poisoned
        self.mask_reads = self.num_embeds_calls = 0
        super().__init__(offset, length, is_embed)

    @property  # type: ignore[override]
    def is_embed(self) -> Any:
        assert not self.poisoned, "is_embed of an item outside every window was read"
        self.mask_reads += 1
        return self._mask

    @is_embed.setter
    def is_embed(self, value: Any) -> None:
        self._mask = value

    def get_num_embeds(self) -> int:
        """The per-call API's size (vLLM's request.get_num_encoder_embeds); the step-level API never calls it."""
        assert not self.poisoned, "get_num_embeds() of an item outside every window was called"
        self.num_embeds_calls += 1
        return super().get_num_embeds()


class Feature:
    """A multimodal feature that counts reads of its identifier."""

    def __init__(self, identifier: str, offset: int, length: int, is_embed: Any = None, *, poisoned: bool = False):
        self._identifier = identifier
        self.mm_position = CountingPlaceholder(offset, length, is_embed, poisoned=poisoned)
        self.identifier_reads = 0

    @property
    def identifier(self) -> str:
        assert not self.mm_position.poisoned, "identifier of an item outside every window was read"
        self.identifier_reads += 1
        return self._identifier

    def reads(self) -> tuple[int, int]:
        return self.identifier_reads, self.mm_position.mask_reads


def test_items_outside_every_window_are_never_read() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    # The middle item is covered by a prefix-cache hit; the last is never reached.
    features = [
        Feature("a", 0, 4),
        Feature("covered", 10, 8, [True, False] * 4, poisoned=True),
        Feature("b", 20, 4, [False, True, True, True]),
        Feature("later", 100, 4, poisoned=True),
    ]
    req = Request("r", features)
    assert manager.try_schedule_encoder_inputs(req, 0, 4, 100) == ([0], 4, 96, [], [])
    manager.allocate_encoder_inputs(req, [0], [])
    assert manager.free_encoder_inputs_before(req, 4) == [0]
    # A prefix-cache hit jumps from token 4 to 18, past the covered item.
    for computed, new in [(18, 3), (21, 2), (23, 10)]:
        out = manager.try_schedule_encoder_inputs(req, computed, new, 100)
        manager.allocate_encoder_inputs(req, out[0], out[4])
        manager.free_encoder_inputs_before(req, computed + new)
    assert manager.freeable == {"a": 4, "b": 3}, "both encoded, then freed"
    assert [f.reads() for f in features[::2]] == [(1, 1), (1, 1)]


@pytest.mark.parametrize("cls", MANAGERS)
def test_an_item_is_read_once_however_many_steps_see_it(cls: type) -> None:
    manager = cls(100)
    features = [Feature("a", 0, 6, [True, True, False, True, True, True]), Feature("b", 0, 4)]
    req = Request("r", features)
    for _ in range(5):  # a step that cannot fit: tried again and again
        assert manager.try_schedule_encoder_inputs(req, 0, 4, 3)[1] == 0
    out = manager.try_schedule_encoder_inputs(req, 0, 6, 100)
    assert out[0] == [0, 1]
    manager.allocate_encoder_inputs(req, out[0], out[4])
    req.num_computed_tokens = 6
    assert manager.free_encoder_inputs_before(req, 6) == [0, 1]
    assert [f.reads() for f in features] == [(1, 1), (1, 1)]
    assert [f.mm_position.num_embeds_calls for f in features] == [0, 0], "no torch cumsum per item"


def test_allocation_reads_the_items_it_is_given() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    features = [Feature("a", 0, 4), Feature("a", 10, 4), Feature("c", 20, 4, poisoned=True)]
    req = Request("r", features)
    manager.allocate_encoder_inputs(req, [0], [1, 1])  # a, and its repeat (twice)
    manager.allocate_encoder_inputs(req, [], [1])
    assert [f.reads() for f in features[:2]] == [(1, 1), (1, 1)]
    assert manager.request_cached_ids == {"r": {0, 1}}


def test_encoder_decoder_frees_read_no_item() -> None:
    """The cache knows each held input's size, so frees read nothing of the items."""
    manager = encoder_cache.EncoderDecoderCacheManager(100)
    features = [Feature("a", 0, 4), Feature("b", 0, 6, [True] * 5 + [False])]
    req = Request("r", features)
    for input_id in range(2):  # allocated outside the step-level API
        manager.allocate(req, input_id)
    baseline = [f.reads() for f in features]
    req.num_computed_tokens = 1
    assert manager.free_encoder_inputs_before(req, 1) == [0, 1]
    assert manager.num_free_slots == 100
    assert [f.reads() for f in features] == baseline


def test_a_bad_item_fails_when_it_is_reached_and_changes_nothing() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    bad = Feature("x", 10, 4)
    bad._identifier = 7  # type: ignore[assignment]
    req = Request("r", [Feature("a", 0, 4), bad])
    assert manager.try_schedule_encoder_inputs(req, 0, 4, 100)[0] == [0]
    before = snapshot(manager)
    with pytest.raises(TypeError, match="identifier must be str"):
        manager.try_schedule_encoder_inputs(req, 0, 14, 100)
    assert snapshot(manager) == before
    bad._identifier = "x"
    assert manager.try_schedule_encoder_inputs(req, 0, 14, 100)[0] == [0, 1]


def test_growth_and_new_objects() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    features = [Feature("a", 0, 4), Feature("b", 10, 4)]
    req = Request("r", features)
    assert manager.try_schedule_encoder_inputs(req, 0, 4, 100)[0] == [0]
    # Streaming input: a new item; b was never read, a is not read again.
    features.append(Feature("c", 20, 4))
    assert manager.try_schedule_encoder_inputs(req, 0, 24, 100)[0] == [0, 1, 2]
    assert manager.try_schedule_encoder_inputs(req, 0, 24, 100)[0] == [0, 1, 2]
    assert [f.reads() for f in features] == [(1, 1), (1, 1), (1, 1)]
    # Another object under the same id: its items are read afresh.
    fresh = [Feature("d", 0, 2), Feature("e", 2, 2)]
    assert manager.try_schedule_encoder_inputs(Request("r", fresh), 0, 4, 100)[0] == [0, 1]
    assert [f.reads() for f in fresh] == [(1, 1), (1, 1)]
    assert [f.reads() for f in features] == [(1, 1), (1, 1), (1, 1)]


class PositionCounter:
    """A feature whose ``mm_position`` reads are counted."""

    def __init__(self, identifier: str, offset: int, length: int) -> None:
        self.identifier = identifier
        self._position = ArrayPlaceholder(offset, length, None)
        self.position_reads = 0

    @property
    def mm_position(self) -> ArrayPlaceholder:
        self.position_reads += 1
        return self._position


@pytest.mark.parametrize("cls", MANAGERS)
def test_positions_are_read_as_the_window_search_needs_them(cls: type) -> None:
    """A long conversation's new turn: a prefix-cache hit covers its first 240
    items, so the step reads the positions its two bisections visit (as vLLM's
    bisections over ``mm_features`` do) and those of the items it schedules,
    not the other 240."""
    manager = cls(10_000)
    features = [PositionCounter(f"img-{i}", 10 * i, 4) for i in range(256)]
    req = Request("r", features)
    computed = 10 * 240 if cls is encoder_cache.EncoderCacheManager else 0
    out = manager.try_schedule_encoder_inputs(req, computed, 10 * 16, 10_000)
    assert out[0] == list(range(240 if computed else 0, 256 if computed else 16))
    manager.allocate_encoder_inputs(req, out[0], out[4])
    assert manager.free_encoder_inputs_before(req, computed + 160) == out[0]
    scheduled = set(out[0])
    untouched = [f.position_reads for i, f in enumerate(features) if i not in scheduled]
    assert sum(untouched) <= 2 * 9, f"{sum(untouched)} position reads of items the step never schedules"
    assert all(features[i].position_reads >= 1 for i in scheduled)


def test_per_call_inputs_have_their_positions_read_when_freed() -> None:
    """An input held through the per-call methods (no position read yet) is
    freed by the step-level call once its placeholder has been passed."""
    manager = encoder_cache.EncoderCacheManager(100)
    features = [PositionCounter("a", 0, 4), PositionCounter("b", 10, 4)]
    req = Request("r", features)
    manager.allocate(req, 1)
    assert manager.free_encoder_inputs_before(req, 5) == []
    assert manager.free_encoder_inputs_before(req, 14) == [1]
    assert manager.request_cached_ids == {}
