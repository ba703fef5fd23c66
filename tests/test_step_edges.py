"""Step-level API edge cases, many from vLLM's own history, checked with
expected values on the Rust managers and on the pure-Python oracle alike."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from step_helpers import ArrayPlaceholder, snapshot

import encoder_cache
from encoder_cache import MultiModalFeature, PlaceholderRange, Request, reference

SHARED = [encoder_cache.EncoderCacheManager, reference.EncoderCacheManager]
ENC_DEC = [encoder_cache.EncoderDecoderCacheManager, reference.EncoderDecoderCacheManager]


def ids(cls: type) -> str:
    return f"{cls.__module__.split('.')[-1]}.{cls.__name__}"


def request(request_id: str, *items: tuple[str, int, int], **kwargs: Any) -> Request:
    """``items`` as ``(identifier, offset, length)``."""
    features = [MultiModalFeature(h, PlaceholderRange(offset, length)) for h, offset, length in items]
    return Request(request_id, features, **kwargs)


def cache_with(cls: type, size: int, *freeable: tuple[str, int]) -> Any:
    """A manager holding ``freeable`` items unreferenced, oldest first."""
    manager = cls(size)
    for n, (identifier, length) in enumerate(freeable):
        old = request(f"old{n}", (identifier, 0, length))
        manager.allocate(old, 0)
        manager.free(old)
    return manager


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_an_item_that_can_never_fit_stops_the_request_before_it(cls: type) -> None:
    manager = cache_with(cls, 10, ("a", 6))
    req = request("r", ("big", 4, 12))
    for _ in range(3):  # no progress however often it is tried
        assert manager.try_schedule_encoder_inputs(req, 0, 20, 100) == ([], 4, 100, [], [])
    assert manager.freeable == {"a": 6}, "nothing is evicted for an item that cannot fit anyway"
    # Past its start (a prefix-cache hit), the request cannot move at all.
    assert manager.try_schedule_encoder_inputs(req, 6, 20, 100) == ([], 0, 100, [], [])
    # Over the compute budget alone is the same stop.
    small = request("s", ("x", 2, 5))
    assert manager.try_schedule_encoder_inputs(small, 0, 8, 4) == ([], 2, 4, [], [])


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_evicted_and_allocated_again_in_one_step_is_not_reported_freed(cls: type) -> None:
    manager = cache_with(cls, 8, ("a", 4), ("b", 4))
    req = request("r", ("c", 0, 4), ("a", 4, 4))
    out = manager.try_schedule_encoder_inputs(req, 0, 8, 100)
    assert out == ([0, 1], 8, 92, [], [])
    assert manager.freed == ["a", "b"], "c evicted a, then a's own allocation evicted b"
    manager.allocate_encoder_inputs(req, out[0] + out[3], out[4])
    assert manager.get_freed_mm_hashes() == ["b"]
    assert manager.cached == {"a": {"r"}, "c": {"r"}}


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_evictions_stand_when_the_step_rolls_back(cls: type) -> None:
    manager = cache_with(cls, 8, ("a", 4), ("b", 4))
    req = request("r", ("c", 0, 4), ("d", 6, 6))
    # c fits after evicting a; d (6) does not fit beside c: roll back to d's start.
    assert manager.try_schedule_encoder_inputs(req, 0, 12, 100) == ([0], 6, 96, [], [])
    assert manager.freed == ["a"] and list(manager.freeable) == ["b"]
    # With chunking disabled the step stops before d's placeholder instead.
    manager = cache_with(cls, 8, ("a", 4), ("b", 4))
    out = manager.try_schedule_encoder_inputs(req, 0, 8, 100, disable_chunked_mm_input=True)
    assert out == ([0], 6, 96, [], [])
    # The drafter shift moves the rollback point back as well.
    out = manager.try_schedule_encoder_inputs(req, 4, 4, 100, 1, disable_chunked_mm_input=True)
    assert out == ([], 1, 100, [], [])


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_duplicates_within_one_step_are_allocated_once_and_held_per_occurrence(cls: type) -> None:
    manager = cls(20)
    req = request("r", ("a", 0, 4), ("b", 5, 2), ("a", 8, 4), ("a", 13, 4))
    out = manager.try_schedule_encoder_inputs(req, 0, 17, 10)
    assert out == ([0, 1], 17, 4, [], [2, 3])
    manager.allocate_encoder_inputs(req, out[0], out[4])
    assert manager.request_hash_refs == {"r": {"a": 3, "b": 1}}
    assert manager.free_encoder_inputs_before(req, 12) == [0, 1, 2]
    assert manager.cached["a"] == {"r"}, "a's last occurrence is still ahead"
    assert manager.free_encoder_inputs_before(req, 17) == [3]
    assert manager.freeable == {"b": 2, "a": 4}


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_mismatch_rejects_after_earlier_hits_and_is_reported(cls: type) -> None:
    manager = cls(30)
    other = request("other", ("a", 0, 3), ("m", 5, 3))
    manager.allocate_encoder_inputs(other, [0, 1], [])  # m is cached with 3 embeddings
    req = request("r", ("b", 0, 4), ("a", 5, 3), ("m", 9, 5))
    seen: list[tuple[Any, ...]] = []
    out = manager.try_schedule_encoder_inputs(req, 0, 14, 10, on_mismatch=lambda *a: seen.append(a))
    assert out == ([], 0, 6, [], []), "budget already spent on b is not given back"
    assert seen == [(req, 2, "m", 3, 5)]
    # The hit on a before the mismatch stays taken; b was never allocated.
    assert manager.request_cached_ids["r"] == {1} and "b" not in manager.cached
    # Without a callback the rejection is the same, silently.
    assert manager.try_schedule_encoder_inputs(req, 0, 14, 10) == ([], 0, 6, [], [])


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_mismatch_between_two_items_of_one_step(cls: type) -> None:
    manager = cls(30)
    req = Request(
        "r",
        [
            MultiModalFeature("a", PlaceholderRange(0, 4)),
            MultiModalFeature("a", PlaceholderRange(5, 4, (True, False, True, True))),
        ],
    )
    seen: list[tuple[Any, ...]] = []
    assert manager.try_schedule_encoder_inputs(req, 0, 9, 10, on_mismatch=lambda *a: seen.append(a)) == (
        [],
        0,
        6,
        [],
        [],
    )
    assert seen == [(req, 1, "a", 4, 3)]


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_remote_items_take_cache_space_but_no_budget(cls: type) -> None:
    manager = cls(8)
    req = request("r", ("a", 0, 4), ("b", 4, 4), ("c", 8, 4))
    asked: list[str] = []

    def has_remote_item(identifier: str) -> bool:
        asked.append(identifier)
        return identifier == "a"

    out = manager.try_schedule_encoder_inputs(req, 0, 12, 4, has_remote_item=has_remote_item)
    assert out == ([1], 8, 0, [0], [])
    assert asked == ["a", "b"]
    manager.allocate_encoder_inputs(req, out[0] + out[3], out[4])
    assert manager.num_free_slots == 0


@pytest.mark.parametrize("cls", SHARED, ids=ids)
@pytest.mark.parametrize("mask", [(False, True, False, True), [False, True, False, True], "array"])
def test_is_embed_masks_in_any_form(cls: type, mask: Any) -> None:
    if mask == "array":
        position: Any = ArrayPlaceholder(2, 4, [False, True, False, True])
    elif isinstance(mask, tuple):
        position = PlaceholderRange(2, 4, mask)
    else:
        position = ArrayPlaceholder(2, 4, None)
        position.is_embed = mask  # a plain list: no .tolist()
        position.get_num_embeds = lambda: 2
        position.get_embeds_indices_in_range = lambda s, e: (
            sum(mask[:s]),
            sum(mask[:e]),
        )
    manager = cls(10)
    req = Request("r", [MultiModalFeature("a", position)])
    assert manager.try_schedule_encoder_inputs(req, 0, 3, 10) == ([], 3, 10, [], []), "only a break token"
    assert manager.try_schedule_encoder_inputs(req, 0, 4, 10) == ([0], 4, 8, [], [])


class TensorMask:
    """A torch tensor's reading surface: ``numpy()`` and ``tolist()``,
    counting which one the manager used. ``dtype`` is the numpy view's; a
    tensor off the CPU (``on_cpu=False``) refuses ``numpy()`` as torch does."""

    def __init__(self, values: list[bool], dtype: Any = bool, on_cpu: bool = True) -> None:
        self.values = values
        self.dtype = dtype
        self.on_cpu = on_cpu
        self.used: list[str] = []

    def numpy(self) -> Any:
        self.used.append("numpy")
        if not self.on_cpu:
            raise TypeError("can't convert cuda:0 device type tensor to numpy")
        return np.asarray(self.values, dtype=self.dtype)

    def tolist(self) -> list[Any]:
        self.used.append("tolist")
        return [self.dtype(v) if self.dtype is not bool else v for v in self.values]

    def __len__(self) -> int:
        return len(self.values)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """For the twin, which reads a mask with numpy as vLLM reads it with torch."""
        return np.asarray(self.values, dtype=dtype or bool)


@pytest.mark.parametrize("cls", SHARED, ids=ids)
@pytest.mark.parametrize("length", [8, 128, 129, 600])
@pytest.mark.parametrize(
    ("dtype", "on_cpu"), [(bool, True), (np.int64, True), (bool, False)], ids=["bool", "int64", "off-cpu"]
)
def test_tensor_masks(cls: type, length: int, dtype: Any, on_cpu: bool) -> None:
    """A tensor mask is read once: by ``tolist()`` up to 128 entries, and past
    that as its numpy view's bytes, or through ``tolist()`` when its entries
    are not a byte each or it has no numpy view. Either way the embeddings
    are its true entries and a step covering only its break tokens encodes
    nothing."""
    values = [i % 3 != 0 for i in range(length)]  # a break token every third
    mask = TensorMask(values, dtype, on_cpu)
    position = ArrayPlaceholder(0, length, values)
    position.is_embed = mask
    manager = cls(1000)
    req = Request("r", [MultiModalFeature("a", position)])
    assert manager.try_schedule_encoder_inputs(req, 0, 1, 1000) == ([], 1, 1000, [], []), "only a break token"
    assert manager.try_schedule_encoder_inputs(req, 0, length, 1000) == ([0], length, 1000 - sum(values), [], [])
    if cls.__module__.startswith("encoder_cache.reference"):
        return  # the twin reads masks with numpy
    if length <= 128:
        assert mask.used == ["tolist"]
    else:
        assert mask.used == (["numpy"] if dtype is bool and on_cpu else ["numpy", "tolist"])


def test_a_mask_of_the_wrong_length_is_refused() -> None:
    manager = encoder_cache.EncoderCacheManager(10)
    position = ArrayPlaceholder(0, 4, [True, False])
    before = snapshot(manager)
    with pytest.raises(ValueError, match="is_embed has 2 entries"):
        manager.try_schedule_encoder_inputs(Request("r", [MultiModalFeature("a", position)]), 0, 4, 10)
    assert snapshot(manager) == before


@pytest.mark.parametrize("cls", SHARED + ENC_DEC, ids=ids)
def test_bad_input_ids_change_nothing(cls: type) -> None:
    manager = cls(10)
    req = request("r", ("a", 0, 4))
    before = snapshot(manager)
    with pytest.raises(IndexError):
        manager.allocate_encoder_inputs(req, [0], [3])
    with pytest.raises(IndexError):
        manager.allocate_encoder_inputs(req, [-1], [])
    assert snapshot(manager) == before


@pytest.mark.parametrize("cls", SHARED + ENC_DEC, ids=ids)
def test_callback_errors_propagate(cls: type) -> None:
    manager = cls(10)
    req = request("r", ("a", 0, 4))

    def broken(identifier: str) -> bool:
        raise KeyError(identifier)

    with pytest.raises(KeyError):
        manager.try_schedule_encoder_inputs(req, 0, 4, 10, has_remote_item=broken)


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_items_added_later_and_new_objects_are_seen(cls: type) -> None:
    manager = cls(50)
    req = request("r", ("a", 0, 4))
    assert manager.try_schedule_encoder_inputs(req, 0, 10, 50)[0] == [0]
    req.mm_features.append(MultiModalFeature("b", PlaceholderRange(6, 3)))  # streaming input
    assert manager.try_schedule_encoder_inputs(req, 0, 10, 50)[0] == [0, 1]
    # Finished, then the id comes back on a new object with other items.
    manager.free(req)
    again = request("r", ("c", 1, 2))
    assert manager.try_schedule_encoder_inputs(again, 0, 10, 50)[0] == [0]
    # A different object under the same id, without a free in between.
    other = request("r", ("d", 0, 2), ("e", 3, 2))
    assert manager.try_schedule_encoder_inputs(other, 0, 10, 50)[0] == [0, 1]


@pytest.mark.parametrize("cls", SHARED, ids=ids)
def test_a_held_input_is_checked_against_a_changed_item(cls: type) -> None:
    manager = cls(50)
    req = request("r", ("a", 0, 4))
    manager.allocate_encoder_inputs(req, [0], [])
    assert manager.try_schedule_encoder_inputs(req, 0, 4, 50) == ([], 4, 50, [], [])
    resized = Request("r", [MultiModalFeature("a", PlaceholderRange(0, 4, (True, True, False, True)))])
    seen: list[tuple[Any, ...]] = []
    assert manager.try_schedule_encoder_inputs(resized, 0, 4, 50, on_mismatch=lambda *a: seen.append(a)) == (
        [],
        0,
        50,
        [],
        [],
    )
    assert seen == [(resized, 0, "a", 4, 3)]
    with pytest.raises(ValueError, match="already holds input 0"):
        manager.try_schedule_encoder_inputs(request("r", ("b", 0, 4)), 0, 4, 50)


@pytest.mark.parametrize("cls", [encoder_cache.EncoderCacheManager, encoder_cache.EncoderDecoderCacheManager])
@pytest.mark.parametrize("release", ["free", "reset"])
def test_requests_are_not_kept_alive(cls: type, release: str) -> None:
    manager = cls(50)
    req = request("r", ("a", 0, 4))
    manager.try_schedule_encoder_inputs(req, 0, 4, 50)
    alive = weakref.ref(req)
    if release == "free":
        manager.free(req)
    else:
        manager.reset()
    del req
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("cls", [encoder_cache.EncoderCacheManager, encoder_cache.EncoderDecoderCacheManager])
def test_a_cycle_through_the_manager_is_collected(cls: type) -> None:
    manager = cls(50)
    req = request("r", ("a", 0, 4))
    req.manager = manager  # type: ignore[attr-defined]
    manager.try_schedule_encoder_inputs(req, 0, 4, 50)
    alive = weakref.ref(req)
    del req, manager
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("cls", ENC_DEC, ids=ids)
def test_encoder_decoder_rules(cls: type) -> None:
    manager = cls(10)
    req = request("r", ("a", 0, 6), ("b", 0, 6))
    # Everything is encoded before the first decoder token, within the cache.
    assert manager.try_schedule_encoder_inputs(req, 0, 3, 100) == ([0], 0, 94, [], [])
    assert manager.try_schedule_encoder_inputs(req, 0, 3, 100, disable_chunked_mm_input=True) == ([0], 0, 94, [], [])
    with pytest.raises(ValueError, match="cannot allocate 6 embeddings"):
        manager.allocate_encoder_inputs(req, [0, 1], [])  # no room for b: the call stops there
    assert manager.num_free_slots == 4
    manager.free(req)
    manager.cache_size = 12
    manager.allocate_encoder_inputs(req, [0, 1], [])
    assert manager.num_free_slots == 0
    # Nothing is freed until a decoder token exists, then everything is, once.
    assert manager.free_encoder_inputs_before(req, 0) == []
    req.num_computed_tokens = 1
    assert manager.free_encoder_inputs_before(req, 0) == [0, 1]
    assert manager.num_free_slots == 12
    assert manager.free_encoder_inputs_before(req, 0) == [], "a decode step frees nothing more"
    assert manager.num_free_slots == 12
    assert manager.try_schedule_encoder_inputs(req, 1, 3, 100) == ([], 3, 100, [], [])
    with pytest.raises(ValueError, match="position 0"):
        manager.try_schedule_encoder_inputs(request("late", ("x", 2, 3)), 1, 5, 100)


@pytest.mark.parametrize("cls", [encoder_cache.EncoderCacheManager, encoder_cache.EncoderDecoderCacheManager])
def test_has_remote_item_must_not_call_back_into_the_manager(cls: type) -> None:
    manager = cls(10)
    with pytest.raises(RuntimeError, match="borrowed"):
        manager.try_schedule_encoder_inputs(
            request("r", ("a", 0, 4)), 0, 4, 10, has_remote_item=lambda identifier: manager.num_free_slots > 0
        )


def test_on_mismatch_runs_after_the_step_and_may_read_the_manager() -> None:
    manager = encoder_cache.EncoderCacheManager(10)
    manager.allocate(request("other", ("a", 0, 3)), 0)
    seen: list[dict[str, set[str]]] = []
    out = manager.try_schedule_encoder_inputs(
        request("r", ("a", 0, 4)), 0, 4, 10, on_mismatch=lambda *args: seen.append(manager.cached)
    )
    assert out == ([], 0, 10, [], [])
    assert seen == [{"a": {"other"}}]
