"""Every message and constant that the Rust core and the Python twin both spell out.

Rust (src/) and Python (the twin, ``encoder_cache.reference``, and the runtime
modules) each keep their own copy of the policies' names and parameters, the
re-encode memory, the counters' names, the snapshot keys, the invariant rules
and the error messages. Each pair is compared here through the public API: the
value is read, or the behaviour that depends on it is driven on both sides, or
the same bad call is made on both and the exception's type and text compared.

``test_every_shared_string_is_compared`` keeps the list complete: it reads
the string literals of both sides' sources, and every fragment they share must
show up in a message or name that the comparisons here produce.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import re
import sys
from pathlib import Path

import pytest
from conftest import OddRequest, make_request

import encoder_cache
from encoder_cache import MultiModalFeature, PlaceholderRange, Request, reference
from encoder_cache.invariants import POLICY_RULES, RULES, InvariantError
from encoder_cache.reference.frequency_memory import (
    FREQUENCY_MEMORY,
    FREQUENCY_MEMORY_EMBEDS,
    FREQUENCY_MEMORY_MAX,
    frequency_memory_bound,
)

ROOT = Path(__file__).resolve().parent.parent
RUST = encoder_cache.EncoderCacheManager
TWIN = reference.EncoderCacheManager
RUST_ENC_DEC = encoder_cache.EncoderDecoderCacheManager
TWIN_ENC_DEC = reference.EncoderDecoderCacheManager


# --- constants ---------------------------------------------------------------


def test_policy_names():
    assert encoder_cache.POLICIES == reference.POLICIES
    assert encoder_cache.POLICIES[0] == "vllm"


def test_stat_counter_names():
    fill = {"entries", "used_embeds", "freeable_embeds", "by_modality"}
    rust, twin = RUST(8).stats(), TWIN(8).stats()
    assert list(rust) == list(twin)
    assert [key for key in rust if key not in fill] == list(reference.STAT_COUNTERS)


def _released_rank(cls, policy: str, size: int, hits: int) -> float:
    """The rank of an entry of ``size`` embeddings, acquired ``1 + hits`` times, once released."""
    manager = cls(4 * size, policy=policy)
    identifiers = ["item"] * (1 + hits)
    request = make_request("r", identifiers, [size] * len(identifiers))
    manager.allocate(request, 0)
    for input_id in range(1, 1 + hits):
        assert manager.check_and_update_cache(request, input_id)
    manager.free(request)
    return manager.snapshot()["entries"]["item"]["rank"]


@pytest.mark.parametrize("size", [1, 576, 8192, 20000])
def test_gdsf_cost_scale(size):
    # Priority = clock (0 here) + frequency * (1 + size / GDSF_COST_SCALE).
    expected = 2 * (1.0 + size / reference.GDSF_COST_SCALE)
    assert _released_rank(RUST, "gdsf", size, hits=1) == _released_rank(TWIN, "gdsf", size, hits=1) == expected


def test_s3fifo_max_credit():
    cap = reference.S3FIFO_MAX_CREDIT
    for hits in range(1, cap + 3):
        assert _released_rank(RUST, "s3fifo", 2, hits) == _released_rank(TWIN, "s3fifo", 2, hits) == min(hits, cap)
    # Both refuse a restored credit above the cap, with the same words.
    state = _s3fifo_state_with_credit(cap + 1)
    assert _restore_error(RUST, state) == _restore_error(TWIN, state)
    assert "has hit credit" in _restore_error(TWIN, state)
    _s3fifo_state_with_credit(cap)  # the cap itself is accepted


def _s3fifo_state_with_credit(credit: int) -> dict:
    manager = RUST(8, policy="s3fifo")
    request = make_request("r", ["item", "item"], [2, 2])
    manager.allocate(request, 0)
    manager.check_and_update_cache(request, 1)
    manager.free(request)
    state = manager.snapshot()
    state["entries"]["item"].update(frequency=10, rank=float(credit))
    if credit <= reference.S3FIFO_MAX_CREDIT:
        RUST.restore(state)
        TWIN.restore(state)
    return state


def _s3fifo_queues_swapped() -> dict:
    """An S3-FIFO state listing an entry of the main queue (hit) before one of the small queue."""
    manager = RUST(8, policy="s3fifo")
    hit = make_request("r", ["hit", "hit"], [2, 2])
    manager.allocate(hit, 0)
    manager.check_and_update_cache(hit, 1)
    once = make_request("q", ["once"], [2])
    manager.allocate(once, 0)
    manager.free(hit)
    manager.free(once)
    state = manager.snapshot()
    assert [item for item, _ in state["freeable"]] == ["once", "hit"]
    state["freeable"].reverse()
    return state


def _arc_state() -> dict:
    """An ARC state with a recent entry ("once") released after a frequent one ("hit")."""
    manager = RUST(8, policy="arc")
    hit = make_request("r", ["hit", "hit"], [2, 2])
    manager.allocate(hit, 0)
    manager.check_and_update_cache(hit, 1)
    once = make_request("q", ["once"], [2])
    manager.allocate(once, 0)
    manager.free(hit)
    manager.free(once)
    state = manager.snapshot()
    assert [item for item, _ in state["freeable"]] == ["once", "hit"]
    assert state["clock"] == 4.0, "the target starts at half the cache size"
    return state


def _arc_lanes_swapped() -> dict:
    state = _arc_state()
    state["freeable"].reverse()
    return state


def test_arc_ghost_bound_is_half_the_cache():
    # A cache of 8 and 14 one-off items of 1 embedding: items 0 to 5 are
    # evicted, then item 6 to make room for the last allocation. The recent
    # ghosts hold the last 4 evicted (half of 8): items 3 to 6.
    def frequency_of(cls, item: str) -> int:
        manager = cls(8, policy="arc")
        for n in range(14):
            request = make_request(f"r{n}", [f"item{n}"], [1])
            assert manager.can_allocate(request, 0, 1, 0)
            manager.allocate(request, 0)
            manager.free(request)
        request = make_request("again", [item], [1])
        assert manager.can_allocate(request, 0, 1, 0)
        manager.allocate(request, 0)
        return manager.snapshot()["entries"][item].get("frequency", 1)

    for item, expected in (("item2", 1), ("item3", 2), ("item6", 2)):
        assert frequency_of(RUST, item) == frequency_of(TWIN, item) == expected, item


def _restore_error(cls, state) -> str:
    with pytest.raises((ValueError, TypeError, InvariantError)) as excinfo:
        cls.restore(copy.deepcopy(state))
    return f"{type(excinfo.value).__name__}: {excinfo.value}"


def _reencodes_after_evictions(cls, evictions: int, reallocate: str) -> int:
    """Evict ``item0``, ``item1``, ... from a one-slot cache, oldest first,
    ``evictions`` of them in all (the last to make room for ``reallocate``),
    then allocate ``reallocate`` again: the re-encodes it counts."""
    manager = cls(1)
    for n in range(evictions):
        request = make_request(f"r{n}", [f"item{n}"], [1])
        assert manager.can_allocate(request, 0, 1, 0)
        manager.allocate(request, 0)
        manager.free(request)
    before = manager.stats()["reencodes"]
    request = make_request("again", [reallocate], [1])
    assert manager.can_allocate(request, 0, 1, 0)
    manager.allocate(request, 0)
    return manager.stats()["reencodes"] - before


def test_evicted_memory():
    memory = reference.EVICTED_MEMORY
    for cls in (RUST, TWIN):
        # After memory + 1 evictions the oldest is forgotten and the next oldest is not.
        assert _reencodes_after_evictions(cls, memory + 1, "item0") == 0
        assert _reencodes_after_evictions(cls, memory + 1, "item1") == 1


def _remembered_frequency(cls, policy: str, cache_size: int, one_offs: int, resize_to: int | None = None) -> int:
    """``hot``, acquired three times, is evicted by the first of ``one_offs``
    items that each fill the cache (each evicting the one before); with
    ``resize_to`` the cache is then resized and filled by one more one-off.
    ``hot`` is allocated again: its frequency, 4 if its count was still
    remembered, else 1."""
    manager = cls(cache_size, policy=policy)
    hot = make_request("hot", ["hot"] * 3, [1] * 3)
    manager.allocate(hot, 0)
    assert manager.check_and_update_cache(hot, 1) and manager.check_and_update_cache(hot, 2)
    manager.free(hot)
    for n in range(one_offs):
        request = make_request(f"r{n}", [f"once{n}"], [cache_size])
        assert manager.can_allocate(request, 0, cache_size, 0)
        manager.allocate(request, 0)
        manager.free(request)
    if resize_to is not None:
        manager.cache_size = resize_to
        request = make_request("filler", ["filler"], [resize_to])
        assert manager.can_allocate(request, 0, resize_to, 0)
        manager.allocate(request, 0)
        manager.free(request)
    again = make_request("again", ["hot"], [1])
    assert manager.can_allocate(again, 0, 1, 0)
    manager.allocate(again, 0)
    manager.free(again)
    return manager.snapshot()["entries"]["hot"].get("frequency", 1)


@pytest.mark.parametrize("policy", ["lfu-ghost", "duel"])
def test_frequency_memory_bound(policy):
    """Both sides remember the counts of as many evicted items, growing with
    the cache up to the same most, and forget the same one first; a shrunk
    cache's bound applies from its next eviction."""
    small, large, huge = 4096, 3000 * FREQUENCY_MEMORY_EMBEDS, 2 * FREQUENCY_MEMORY_MAX * FREQUENCY_MEMORY_EMBEDS
    assert frequency_memory_bound(small) == FREQUENCY_MEMORY and frequency_memory_bound(large) == 3000
    assert frequency_memory_bound(huge) == FREQUENCY_MEMORY_MAX
    for cache_size in (small, large, huge):
        bound = frequency_memory_bound(cache_size)
        # hot's eviction, then one per one-off but the first, then the last one-off's (to make room for hot).
        remembered = [_remembered_frequency(cls, policy, cache_size, bound - 1) for cls in (RUST, TWIN)]
        forgotten = [_remembered_frequency(cls, policy, cache_size, bound) for cls in (RUST, TWIN)]
        assert remembered == [4, 4] and forgotten == [1, 1], (cache_size, remembered, forgotten)
    shrunk = [_remembered_frequency(cls, policy, large, 2500, resize_to=small) for cls in (RUST, TWIN)]
    assert shrunk == [1, 1], "the first eviction after the resize trims the memory to the small cache's bound"


def test_event_log_bound():
    """Both logs keep identifiers pending up to the same default bound, and overflow past it."""
    bound = reference.EVENT_LOG_MAX_PENDING
    assert bound == 1 << 16
    request = make_request("many", [f"i{n}" for n in range(bound + 1)], [0] * (bound + 1))
    for cls in (RUST, TWIN):
        manager = cls(0)
        manager.enable_events()
        for input_id in range(bound):
            manager.allocate(request, input_id)
        assert not manager.take_step_events()[0], "the bound itself fits"
        for input_id in range(bound + 1):
            manager.free_encoder_input(request, input_id)
            manager.allocate(make_request(f"x{input_id}", [f"j{input_id}"], [0]), 0)
        assert manager.take_step_events()[0], "one past it overflows"
    for cls in (RUST, TWIN):
        manager = _busy(cls)
        manager.enable_events()
        manager.enable_events(2)  # enabling again changes the bound only
        for n in range(2):
            manager.allocate(make_request(f"s{n}", [f"new{n}"], [1]), 0)
        assert manager.take_step_events() == (False, [], [("new0", 1, "image"), ("new1", 1, "image")])
        for n in range(2, 5):
            manager.allocate(make_request(f"s{n}", [f"new{n}"], [0]), 0)
        assert manager.take_step_events() == (True, [], manager.cached_items())
        assert len(manager.cached_items()) == 7


def test_unknown_modality():
    request = OddRequest("r", ["a"], [2])  # features with no modality
    for cls in (RUST, TWIN):
        manager = cls(4)
        manager.allocate(request, 0)
        assert list(manager.stats()["by_modality"]) == ["unknown"]


# --- messages ------------------------------------------------------------------


def _busy(cls):
    """r0 holds img0 (4 embeddings); img1 (2) is freeable; 2 of 8 slots free."""
    manager = cls(8)
    held = make_request("r0", ["img0"], [4])
    manager.allocate(held, 0)
    old = make_request("old", ["img1"], [2])
    manager.allocate(old, 0)
    manager.free(old)
    return manager


def _mark_twice(manager):
    request = make_request("w", ["img0"], [4])
    manager.mark_waiting(request)
    manager.mark_waiting(request)


def _allocate_held_as_other(manager):
    request = make_request("r0", ["imgX"], [4])
    manager.check_and_update_cache(request, 0)


#: name -> (manager factory, the call); each runs on the Rust class and the twin.
CACHE_CASES = {
    "policy name": (lambda cls: cls(8, policy="lru"), None),
    "cache_size negative": (lambda cls: cls(-1), None),
    "cache_size bool": (lambda cls: cls(True), None),
    "cache_size too large": (lambda cls: cls(2**63), None),
    "no room": (_busy, lambda m: m.allocate(make_request("r9", ["big"], [7]), 0)),
    "size mismatch": (_busy, lambda m: m.allocate(make_request("r9", ["img0"], [3]), 0)),
    "already cached": (_busy, lambda m: m.allocate(make_request("r9", ["img0"], [4]), 0)),
    "held as another item": (_busy, _allocate_held_as_other),
    "resize below referenced": (_busy, lambda m: setattr(m, "cache_size", 3)),
    "marked twice": (_busy, _mark_twice),
    "not marked": (_busy, lambda m: m.unmark_waiting(make_request("w", ["img0"], [4]))),
    "input out of range, one item": (_busy, lambda m: m.check_and_update_cache(make_request("r", ["a"], [1]), 1)),
    "input out of range, items": (_busy, lambda m: m.can_allocate(make_request("r", ["a", "b"], [1, 1]), 5, 9, 0)),
    "input negative": (_busy, lambda m: m.get_cached_num_encoder_embeds(make_request("r", ["a"], [1]), -1)),
    "request id not str": (_busy, lambda m: m.allocate(OddRequest(7, ["a"], [1]), 0)),
    "identifier not str": (_busy, lambda m: m.check_and_update_cache(OddRequest("r", [b"a"], [1]), 0)),
    "embeds not int": (_busy, lambda m: m.can_allocate(OddRequest("r", ["a"], [1.0]), 0, 9, 0)),
    "embeds bool": (_busy, lambda m: m.can_allocate(OddRequest("r", ["a"], [True]), 0, 9, 0)),
    "embeds negative": (_busy, lambda m: m.can_allocate(OddRequest("r", ["a"], [-2]), 0, 9, 0)),
    "embeds too large": (_busy, lambda m: m.can_allocate(OddRequest("r", ["a"], [2**64]), 0, 9, 0)),
    "waiting identifier not str": (_busy, lambda m: m.mark_waiting(OddRequest("w", [None], [1]))),
    "waiting start negative": (_busy, lambda m: m.mark_waiting(make_request("w", ["img0"], [4]), -1)),
    "waiting offset not int": (_busy, lambda m: m.mark_waiting(_odd_position("offset"), 1)),
    "waiting length negative": (_busy, lambda m: m.mark_waiting(_odd_position("length", -4), 1)),
    "step allocate out of range": (
        _busy,
        lambda m: m.allocate_encoder_inputs(make_request("r", ["a"], [1]), [0, 3], []),
    ),
    "events off": (_busy, lambda m: m.take_step_events()),
    "events bound negative": (_busy, lambda m: m.enable_events(-1)),
    "events bound not int": (_busy, lambda m: m.enable_events(2.5)),
    "step hook not callable": (_busy, lambda m: m.set_step_hook(42)),
}


def _enc_dec_held(cls):
    manager = cls(8)
    manager.allocate(make_request("r0", ["a"], [4]), 0)
    return manager


ENC_DEC_CASES = {
    "encoder-decoder input held": (_enc_dec_held, lambda m: m.allocate(make_request("r0", ["a"], [4]), 0)),
    "encoder-decoder no room": (_enc_dec_held, lambda m: m.allocate(make_request("r1", ["b"], [5]), 0)),
    "encoder-decoder resize": (_enc_dec_held, lambda m: setattr(m, "cache_size", 3)),
    "encoder-decoder cache_size": (lambda cls: cls(-4), None),
}


def _error(make, call, cls) -> str:
    with pytest.raises(Exception) as excinfo:
        manager = make(cls)
        call(manager)
    return f"{type(excinfo.value).__name__}: {excinfo.value}"


def _odd_position(field: str, value: object = "4") -> Request:
    """A waiting request whose one placeholder has a bad ``offset`` or ``length``."""
    position = _Placeholder(0, 4, None)
    setattr(position, field, value)
    feature = MultiModalFeature("img0", PlaceholderRange(0, 4))
    object.__setattr__(feature, "mm_position", position)
    return Request("w", [feature])


def _case_errors(name: str) -> tuple[str, str]:
    if name in CACHE_CASES:
        make, call = CACHE_CASES[name]
        classes = (RUST, TWIN)
    else:
        make, call = ENC_DEC_CASES[name]
        classes = (RUST_ENC_DEC, TWIN_ENC_DEC)
    call = call or (lambda manager: None)
    rust, twin = (_error(make, call, cls) for cls in classes)
    return rust, twin


@pytest.mark.parametrize("name", [*CACHE_CASES, *ENC_DEC_CASES])
def test_error_messages(name):
    rust, twin = _case_errors(name)
    assert rust == twin


def _valid_state() -> dict:
    """r0 holds img0 twice and img1; r1 holds img1; img3, img4 and img2 are
    freeable in that order, as w waits for img2. 31 of 40 slots cached, under gdsf."""
    manager = RUST(40, policy="gdsf")
    r0 = make_request("r0", ["img0", "img1", "img0"], [2, 5, 2])
    r1, r2, r3 = make_request("r1", ["img1"], [5]), make_request("r2", ["img2"], [8]), make_request("r3", ["img3"], [8])
    manager.allocate(r0, 0)
    manager.allocate(r0, 1)
    manager.check_and_update_cache(r0, 2)
    manager.check_and_update_cache(r1, 0)
    manager.allocate(r2, 0)
    manager.allocate(r3, 0)
    manager.allocate(make_request("r4", ["img4"], [8]), 0)
    manager.mark_waiting(make_request("w", ["img2"], [8]))
    manager.free(r2)
    manager.free(r3)
    manager.free(make_request("r4", ["img4"], [8]))
    return manager.snapshot()


def _with(path: str, value, state: dict | None = None) -> dict:
    state = copy.deepcopy(state or _valid_state())
    *parents, last = path.split("/")
    node = state
    for key in parents:
        node = node[int(key) if isinstance(node, list) else key]
    if value is _DELETE:
        del node[int(last) if isinstance(node, list) else last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return state


_DELETE = object()

#: name -> a state restore must refuse: a broken rule, or a malformed field.
STATE_CASES = {
    "slots": _with("num_free_slots", 3),
    "freeable size": _with("freeable/0/1", 5),
    "freeable order": _with("entries/img4/rank", 1.0),
    "unreferenced not freeable": _with("freeable", []),
    "listed twice": _with("freeable", [["img3", 8], ["img4", 8], ["img2", 8], ["img2", 8]]),
    "freeable referenced": _with("freeable", [["img3", 8], ["img4", 8], ["img2", 8], ["img0", 2]]),
    "freeable not cached": _with("freeable", [["img3", 8], ["img4", 8], ["img2", 8], ["img9", 2]]),
    "freeable slots": _with("num_freeable_slots", 30),
    "occurrences": _with("requests/r0/occurrences/img0", 1),
    "no inputs": _with("requests/r1/inputs", []),
    "referrer not counting": _with("entries/img0/referrers", ["r0", "r1"]),
    "counted not referrer": _with("entries/img1/referrers", ["r0"]),
    "counted not cached": _with(
        "requests/r1", {"inputs": [[0, "imgZ"]], "occurrences": {"imgZ": 1}}, _with("entries/img1/referrers", ["r0"])
    ),
    "tiers": _with("freeable", [["img3", 8], ["img2", 8], ["img4", 8]]),
    "frequency 0": _with("entries/img0/frequency", 0),
    "referenced rank": _with("entries/img0/rank", 1.5),
    "priority below clock": _with("clock", 100.0),
    "vllm rank": _with("policy", "vllm"),
    "cache_size type": _with("cache_size", "40"),
    "cache_size range": _with("cache_size", 2**64),
    "rank type": _with("entries/img2/rank", "1"),
    "rank range": _with("entries/img2/rank", float("inf")),
    "frequency range": _with("entries/img0/frequency", 2**32),
    "entry keys": _with("entries/img0", {"num_embeds": 2}),
    "entry extra key": _with("entries/img0/size", 2),
    "state keys": _with("freed", _DELETE),
    "state extra key": _with("extra", 1),
    "freeable pair": _with("freeable/0", ["img2"]),
    "freeable not list": _with("freeable", "img2"),
    "freeable item": _with("freeable/0/0", 2),
    "freeable size type": _with("freeable/0/1", "8"),
    "entries not dict": _with("entries", []),
    "referrers": _with("entries/img0/referrers", "r0"),
    "num_embeds": _with("entries/img0/num_embeds", 2.0),
    "requests": _with("requests", []),
    "request keys": _with("requests/r0", {"inputs": []}),
    "input pair": _with("requests/r0/inputs/0", [0, 7]),
    "input pair length": _with("requests/r0/inputs/0", [0]),
    "num_free_slots type": _with("num_free_slots", "3"),
    "num_freeable_slots type": _with("num_freeable_slots", None),
    "input id": _with("requests/r0/inputs/0", ["0", "img0"]),
    "inputs": _with("requests/r0/inputs", {}),
    "occurrence count": _with("requests/r0/occurrences/img0", 2**32),
    "occurrence item": _with("requests/r0/occurrences", {1: 2}),
    "occurrences type": _with("requests/r0/occurrences", []),
    "request id": _with("requests", {1: {"inputs": [], "occurrences": {}}}),
    "freed": _with("freed", [None]),
    "policy type": _with("policy", 1),
    "policy name": _with("policy", "lru"),
    "clock": _with("clock", -1.0),
    "waiting": _with("waiting", []),
    "waiting items": _with("waiting/w", "img2"),
    "waiting item": _with("waiting/w", [2]),
    "waiting distinct": _with("waiting/w", ["img2", "img2"]),
    "waiting id": _with("waiting", {3: ["img2"]}),
    "s3fifo credit": _s3fifo_state_with_credit(reference.S3FIFO_MAX_CREDIT + 1),
    "s3fifo queues": _s3fifo_queues_swapped(),
    "arc target": _with("clock", 1.5, _arc_state()),
    "arc target size": _with("clock", 9.0, _arc_state()),
    "arc lanes": _arc_lanes_swapped(),
    "not a dict": "state",
}


def _enc_dec_state() -> dict:
    return _enc_dec_held(RUST_ENC_DEC).snapshot()


ENC_DEC_STATE_CASES = {
    "encoder-decoder slots": _with("num_free_slots", 5, _enc_dec_state()),
    "encoder-decoder keys": _with("to_free", _DELETE, _enc_dec_state()),
    "encoder-decoder held": _with("held", [], _enc_dec_state()),
    "encoder-decoder held inputs": _with("held/r0", {}, _enc_dec_state()),
    "encoder-decoder held pair": _with("held/r0/0", [0], _enc_dec_state()),
    "encoder-decoder held size": _with("held/r0/0/1", -1, _enc_dec_state()),
    "encoder-decoder request id": _with("held", {0: [[0, 4]]}, _enc_dec_state()),
    "encoder-decoder allocated": _with("allocated", [0], _enc_dec_state()),
    "encoder-decoder to_free": _with("to_free", "a", _enc_dec_state()),
    "encoder-decoder cache_size": _with("cache_size", None, _enc_dec_state()),
    "encoder-decoder num_free_slots": _with("num_free_slots", 1.0, _enc_dec_state()),
}


def _state_errors(name: str) -> tuple[str, str]:
    if name in STATE_CASES:
        return _restore_error(RUST, STATE_CASES[name]), _restore_error(TWIN, STATE_CASES[name])
    state = ENC_DEC_STATE_CASES[name]
    return _restore_error(RUST_ENC_DEC, state), _restore_error(TWIN_ENC_DEC, state)


@pytest.mark.parametrize("name", [*STATE_CASES, *ENC_DEC_STATE_CASES])
def test_state_messages(name):
    rust, twin = _state_errors(name)
    assert rust == twin


class _Placeholder:
    """A placeholder as vLLM's is read: its mask is checked when a step reads it."""

    def __init__(self, offset, length, is_embed):
        self.offset, self.length, self.is_embed = offset, length, is_embed

    def get_num_embeds(self):
        return sum(self.is_embed)


def _mask_errors() -> tuple[str, str]:
    """A mask of the wrong length: read by the Rust step, refused by PlaceholderRange."""
    feature = MultiModalFeature("a", PlaceholderRange(0, 3))
    object.__setattr__(feature, "mm_position", _Placeholder(0, 3, [True, False]))
    with pytest.raises(ValueError) as rust:
        RUST(8).try_schedule_encoder_inputs(Request("r", [feature]), 0, 3, 8)
    with pytest.raises(ValueError) as python:
        PlaceholderRange(0, 3, is_embed=[True, False])
    return str(rust.value), str(python.value)


def _step_hook_wait_errors(wait: object) -> tuple[str, str]:
    """What each manager reports of a step hook that returned ``wait``: the
    Rust one through ``sys.unraisablehook``, the twin as the last line it writes to stderr."""
    reported: list[BaseException] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda args: reported.append(args.exc_value)
    try:
        rust = RUST(8)
        rust.set_step_hook(lambda m: wait)
        rust.get_freed_mm_hashes()
    finally:
        sys.unraisablehook = hook
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        twin = TWIN(8)
        twin.set_step_hook(lambda m: wait)
        twin.get_freed_mm_hashes()
    (error,) = reported
    return f"{type(error).__name__}: {error}", err.getvalue().strip().splitlines()[-1]


@pytest.mark.parametrize("wait", [-1, -0.5, float("nan"), float("inf"), "soon", True, 10**400])
def test_step_hook_wait_messages(wait):
    rust, twin = _step_hook_wait_errors(wait)
    assert rust == twin


def test_is_embed_length_message():
    rust, python = _mask_errors()
    assert rust == f"mm_position.{python}"


def test_every_invariant_rule_is_reported_in_the_same_words():
    reported = {_state_errors(name)[0] for name in STATE_CASES}
    for rule in (*RULES, *POLICY_RULES):
        assert any(f"inconsistent state: {rule}: " in message for message in reported), rule


def test_invariant_error_on_a_live_manager():
    state = _valid_state()
    for cls in (RUST, TWIN):
        manager = cls.restore(copy.deepcopy(state))
        manager.check_invariants()
    twin = TWIN.restore(copy.deepcopy(state))
    twin.num_free_slots += 1
    with pytest.raises(InvariantError, match=f"^{re.escape(RULES[0])}: "):
        twin.check_invariants()


# --- completeness ----------------------------------------------------------------

#: Python sources with Rust counterparts: the runtime modules and the twin.
PYTHON_SOURCES = [
    path
    for path in sorted((ROOT / "python" / "encoder_cache").rglob("*.py"))
    if "simulator" not in path.parts and path.name not in ("vllm.py", "__main__.py")
]


def _fragments(text: str) -> set[str]:
    """The pieces of a literal between format fields, trimmed, of 12 characters or more."""
    pieces = re.split(r"\{[^{}]*\}|%[sdr]", text)
    return {piece.strip(" :;,.'\"`") for piece in pieces} - {""}


def _rust_strings() -> set[str]:
    found = set()
    for path in sorted((ROOT / "src").rglob("*.rs")):
        text = path.read_text()
        text = text.split("#[cfg(test)]")[0]  # the code, not its unit tests
        text = re.sub(r"\\\n\s*", "", text)  # string continuation lines
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', text):
            found |= _fragments(literal.replace('\\"', '"'))
    return {s for s in found if len(s) >= 12}


def _python_strings() -> set[str]:
    found = set()
    for path in PYTHON_SOURCES:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found |= _fragments(node.value)
    return {s for s in found if len(s) >= 12}


def _everything_compared() -> str:
    """Every message and name the comparisons above read from the Rust side."""
    seen = [rust for name in [*CACHE_CASES, *ENC_DEC_CASES] for rust in _case_errors(name)[:1]]
    seen += [rust for name in [*STATE_CASES, *ENC_DEC_STATE_CASES] for rust in _state_errors(name)[:1]]
    seen += list(RUST(8).stats()) + list(RUST(8).snapshot()) + list(_valid_state()["entries"]["img0"])
    seen += list(RUST_ENC_DEC(8).snapshot())
    seen += _mask_errors()[:1]
    seen += _step_hook_wait_errors(-1)[:1]
    # Names both sides spell because they are the API: classes, and the request's fields.
    seen += [RUST.__name__, RUST_ENC_DEC.__name__, "num_computed_tokens"]
    # The request classes the bindings recognise by module and name (see test_known_request_classes).
    seen += [f"{cls.__module__}.{cls.__qualname__}" for cls in KNOWN_CLASSES]
    # The event types the Rust core writes into event payloads.
    seen += _event_types(RUST)
    # The host tier's block cache: its names and the counters encoder_cache.host_tier logs.
    seen += [encoder_cache.HostBlockCache.__name__, "HOST_POLICIES", *encoder_cache.HostBlockCache(1).stats()]
    return "\n".join(seen)


def _event_types(cls) -> list[str]:
    """The event types of a manager's batches: a store, a removal, a clear, in that order."""
    manager = cls(4)
    manager.enable_events()
    request = make_request("r", ["a"], [4])
    manager.allocate(request, 0)
    manager.free(request)
    manager.get_freed_mm_hashes()
    types = [event["type"] for event in manager.take_event_batch().events()]
    manager.cache_size = 0  # evicts a
    assert manager.get_freed_mm_hashes() == ["a"]
    types += [event["type"] for event in manager.take_event_batch().events()]
    manager.reset()
    return types + [event["type"] for event in manager.take_event_batch().events()]


def test_event_type_names():
    """The Rust core writes the event types into its payloads; the wire module and the twin spell them too."""
    from encoder_cache.events import wire

    assert _event_types(RUST) == _event_types(TWIN) == [wire.STORED, wire.REMOVED, wire.CLEARED]


def test_host_tier_names_and_counters():
    """encoder_cache.host_tier (which needs vLLM) reads these counters by name from the Rust cache."""
    assert encoder_cache.HOST_POLICIES == encoder_cache._core.HOST_POLICIES == ("fifo", "gdsf", "s3fifo")
    assert "HOST_POLICIES" in encoder_cache.__all__ and "HostBlockCache" in encoder_cache.__all__
    logged = {"pins", "allocs", "alloc_failures", "evictions", "entries", "free_blocks"}
    assert logged <= set(encoder_cache.HostBlockCache(1).stats())


KNOWN_CLASSES = (encoder_cache.Request, encoder_cache.MultiModalFeature, encoder_cache.PlaceholderRange)


def test_known_request_classes():
    """The bindings read an unmasked item's size from the placeholder for these classes, named in Rust
    by module and qualified name: a subclass is asked through get_num_encoder_embeds as before."""
    assert [(cls.__module__, cls.__qualname__) for cls in KNOWN_CLASSES] == [
        ("encoder_cache.request", "Request"),
        ("encoder_cache.request", "MultiModalFeature"),
        ("encoder_cache.request", "PlaceholderRange"),
    ]

    class Asked(encoder_cache.Request):
        def get_num_encoder_embeds(self, input_id: int) -> int:
            return 3

    feature = encoder_cache.MultiModalFeature("a", encoder_cache.PlaceholderRange(0, 8))
    manager = RUST(8)
    assert manager.can_allocate(encoder_cache.Request("r", [feature]), 0, 8, 5) is False, "8 embeddings beside 5"
    assert manager.can_allocate(Asked("s", [feature]), 0, 8, 5) is True, "the subclass's 3 embeddings"


def test_every_shared_string_is_compared():
    shared = _rust_strings() & _python_strings()
    assert len(shared) >= 30, "the scan must find the known pairs"
    compared = _everything_compared()
    missing = sorted(fragment for fragment in shared if fragment not in compared)
    assert not missing, f"Rust and Python both spell these; compare them in this file: {missing}"
