"""Every method and readable field of the manager, on both implementations."""

from __future__ import annotations

import pytest
from conftest import make_request, state

import encoder_cache
from encoder_cache import reference


def test_a_new_manager_is_empty(manager_cls):
    manager = manager_cls(16)
    assert state(manager) == {
        "cache_size": 16,
        "num_free_slots": 16,
        "num_freeable_slots": 16,
        "cached": {},
        "num_embeds_by_hash": {},
        "freeable": [],
        "request_cached_ids": {},
        "request_hash_refs": {},
        "freed": [],
    }
    assert manager.get_manager_metadata() is None


def test_create_manager_builds_the_class_it_is_called_on(manager_cls):
    class Custom(manager_cls):
        pass

    manager = Custom.create_manager(cache_size=12, vllm_config=object())
    assert type(manager) is Custom
    assert manager.cache_size == 12
    assert manager_cls.create_manager(cache_size=3).cache_size == 3
    with pytest.raises(TypeError):
        manager_cls.create_manager(12)  # keyword-only, as in vLLM


def test_allocate_reserves_space_and_references_the_item(manager_cls):
    manager = manager_cls(10)
    request = make_request("r1", ["a", "b"], [3, 4])
    manager.allocate(request, 1)
    assert manager.cached == {"b": {"r1"}}
    assert manager.num_embeds_by_hash == {"b": 4}
    assert manager.request_cached_ids == {"r1": {1}}
    assert manager.request_hash_refs == {"r1": {"b": 1}}
    assert (manager.num_free_slots, manager.num_freeable_slots) == (6, 6)
    assert manager.get_cached_num_encoder_embeds(request, 1) == 4
    assert manager.get_cached_num_encoder_embeds(request, 0) is None
    assert manager.get_cached_input_ids(request) == {1}


def test_check_and_update_cache_misses_then_hits_from_another_request(manager_cls):
    manager = manager_cls(10)
    first = make_request("r1", ["a"], [3])
    second = make_request("r2", ["x", "a"], [2, 3])
    assert not manager.check_and_update_cache(first, 0)
    assert manager.request_cached_ids == {}
    manager.allocate(first, 0)
    assert manager.check_and_update_cache(second, 1)
    assert manager.cached == {"a": {"r1", "r2"}}
    assert manager.request_cached_ids == {"r1": {0}, "r2": {1}}
    assert manager.num_free_slots == 7  # a hit costs no space


def test_a_hit_on_an_unreferenced_entry_takes_it_off_the_eviction_list(manager_cls):
    manager = manager_cls(10)
    first = make_request("r1", ["a"], [3])
    manager.allocate(first, 0)
    manager.free(first)
    assert manager.freeable == {"a": 3}
    assert manager.num_freeable_slots == 10
    second = make_request("r2", ["a"], [3])
    assert manager.check_and_update_cache(second, 0)
    assert manager.freeable == {}
    assert manager.num_freeable_slots == 7
    assert manager.cached == {"a": {"r2"}}


def test_a_repeated_hit_on_the_same_input_counts_once(manager_cls):
    manager = manager_cls(10)
    request = make_request("r1", ["a", "a"], [3, 3])
    manager.allocate(request, 0)
    assert manager.check_and_update_cache(request, 0)
    assert manager.check_and_update_cache(request, 1)
    assert manager.check_and_update_cache(request, 1)
    assert manager.request_hash_refs == {"r1": {"a": 2}}
    manager.free_encoder_input(request, 0)
    assert manager.freeable == {}
    manager.free_encoder_input(request, 1)
    assert manager.freeable == {"a": 3}


def test_can_allocate_checks_the_compute_budget_first(manager_cls):
    manager = manager_cls(100)
    request = make_request("r1", ["a"], [10])
    assert not manager.can_allocate(request, 0, 9, 0)
    assert manager.can_allocate(request, 0, 10, 0)


def test_can_allocate_counts_what_the_step_already_scheduled(manager_cls):
    manager = manager_cls(20)
    request = make_request("r1", ["a"], [10])
    assert manager.can_allocate(request, 0, 100, 10)
    assert not manager.can_allocate(request, 0, 100, 11)
    assert manager.num_free_slots == 20  # checking alone reserves nothing


def test_can_allocate_evicts_oldest_released_first_and_only_as_needed(manager_cls):
    manager = manager_cls(12)
    owners = [make_request(f"r{i}", [item], [4]) for i, item in enumerate("abc")]
    for owner in owners:
        manager.allocate(owner, 0)
    for owner in (owners[1], owners[0], owners[2]):  # release order: b, a, c
        manager.free(owner)
    assert list(manager.freeable) == ["b", "a", "c"]
    assert (manager.num_free_slots, manager.num_freeable_slots) == (0, 12)

    newcomer = make_request("r9", ["z"], [6])
    assert manager.can_allocate(newcomer, 0, 100, 0)
    assert manager.freed == ["b", "a"]
    assert list(manager.freeable) == ["c"]
    assert set(manager.cached) == {"c"}
    assert (manager.num_free_slots, manager.num_freeable_slots) == (8, 12)


def test_can_allocate_refuses_without_evicting_when_nothing_would_fit(manager_cls):
    manager = manager_cls(10)
    holder = make_request("r1", ["a", "b"], [4, 4])
    manager.allocate(holder, 0)
    manager.allocate(holder, 1)
    manager.free_encoder_input(holder, 0)
    before = state(manager)
    assert not manager.can_allocate(make_request("r2", ["z"], [7]), 0, 100, 0)
    assert state(manager) == before


def test_free_encoder_input_of_an_unheld_input_changes_nothing(manager_cls):
    manager = manager_cls(10)
    request = make_request("r1", ["a", "b"], [3, 3])
    manager.allocate(request, 0)
    before = state(manager)
    manager.free_encoder_input(request, 1)
    manager.free_encoder_input(make_request("r2", ["a"], [3]), 0)
    assert state(manager) == before


def test_free_releases_every_item_in_input_order(manager_cls):
    manager = manager_cls(30)
    request = make_request("r1", ["c", "a", "b", "a"], [3, 4, 5, 4])
    for input_id in (2, 0, 1):
        manager.allocate(request, input_id)
    assert manager.check_and_update_cache(request, 3)
    manager.free(request)
    # "a" is released at its last occurrence, input 3.
    assert list(manager.freeable.items()) == [("c", 3), ("b", 5), ("a", 4)]
    assert manager.request_cached_ids == {}
    assert manager.request_hash_refs == {}
    assert manager.get_cached_input_ids(request) == set()
    manager.free(request)  # freeing twice is harmless
    assert manager.num_freeable_slots == 30


def test_an_entry_shared_by_two_requests_is_freeable_only_after_both_release(manager_cls):
    manager = manager_cls(10)
    first = make_request("r1", ["a"], [3])
    second = make_request("r2", ["a"], [3])
    manager.allocate(first, 0)
    manager.check_and_update_cache(second, 0)
    manager.free(first)
    assert manager.freeable == {}
    assert manager.cached == {"a": {"r2"}}
    manager.free(second)
    assert manager.freeable == {"a": 3}


def test_get_freed_mm_hashes_reports_each_eviction_once(manager_cls):
    manager = manager_cls(4)
    first = make_request("r1", ["a"], [4])
    manager.allocate(first, 0)
    manager.free(first)
    assert manager.can_allocate(make_request("r2", ["b"], [4]), 0, 100, 0)
    assert manager.get_freed_mm_hashes() == ["a"]
    assert manager.get_freed_mm_hashes() == []
    assert manager.freed == []


def test_an_entry_evicted_and_allocated_again_before_the_report_is_not_reported(manager_cls):
    manager = manager_cls(8)
    a, b = make_request("r1", ["a"], [4]), make_request("r2", ["b"], [4])
    manager.allocate(a, 0)
    manager.allocate(b, 0)
    manager.free(a)
    manager.free(b)
    again = make_request("r3", ["a", "c"], [4, 4])
    assert manager.can_allocate(again, 1, 100, 4)  # evicts a and b
    assert manager.freed == ["a", "b"]
    manager.allocate(again, 0)  # "a" comes back in the same step
    assert manager.get_freed_mm_hashes() == ["b"]


def test_reset_forgets_everything(manager_cls):
    manager = manager_cls(10)
    request = make_request("r1", ["a", "b"], [3, 3])
    manager.allocate(request, 0)
    manager.allocate(request, 1)
    manager.free_encoder_input(request, 0)
    manager.can_allocate(make_request("r2", ["z"], [6]), 0, 100, 0)
    manager.reset()
    assert state(manager) == state(manager_cls(10))


def test_readable_state_of_the_rust_manager_is_a_snapshot():
    manager = encoder_cache.EncoderCacheManager(10)
    manager.allocate(make_request("r1", ["a"], [3]), 0)
    snapshot = manager.cached
    snapshot["a"].add("intruder")
    snapshot["b"] = set()
    assert manager.cached == {"a": {"r1"}}


@pytest.mark.parametrize(
    "cls", [encoder_cache.EncoderDecoderCacheManager, reference.EncoderDecoderCacheManager], ids=["rust", "python"]
)
def test_encoder_decoder_manager_reserves_per_request_and_reports_a_step_late(cls):
    manager = cls(10)
    request = make_request("r1", ["a", "b"], [4, 3])
    assert not manager.check_and_update_cache(request, 0)
    assert manager.get_cached_num_encoder_embeds(request, 0) is None
    assert manager.can_allocate(request, 0, 4, 6)
    assert not manager.can_allocate(request, 0, 3, 0)
    assert not manager.can_allocate(request, 0, 100, 7)
    manager.allocate(request, 0)
    manager.allocate(request, 1)
    assert manager.num_free_slots == 3
    assert manager.allocated == ["a", "b"]
    assert manager.get_cached_input_ids(request) == {0, 1}
    assert manager.get_freed_mm_hashes() == []  # the step that allocated has not run yet
    assert manager.get_freed_mm_hashes() == ["a", "b"]
    manager.free_encoder_input(request, 1)
    assert (manager.num_free_slots, manager.get_cached_input_ids(request)) == (6, {0})
    for _ in range(3):  # vLLM's scheduler frees a decoding request's inputs on every step
        manager.free_encoder_input(request, 1)
    assert manager.num_free_slots == 6, "each held input is freed once (vLLM 0.33 would count it again)"
    manager.free(request)
    manager.free(request)
    assert (manager.num_free_slots, manager.get_cached_input_ids(request)) == (10, set())
    manager.check_invariants()
    manager.allocate(request, 0)
    manager.reset()
    assert (manager.num_free_slots, manager.allocated, manager.to_free) == (10, [], [])
    assert manager.get_manager_metadata() is None
    assert type(cls.create_manager(cache_size=5)) is cls
