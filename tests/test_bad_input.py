"""Bad input gets a clear Python exception and leaves every field as it was."""

from __future__ import annotations

import pytest
from conftest import OddRequest, make_request, state

from encoder_cache import EncoderCacheManager, EncoderDecoderCacheManager, reference


class Boom(Exception):
    pass


def busy_manager(manager_cls):
    """A manager with some of everything: referenced, freeable and evicted entries."""
    manager = manager_cls(12)
    holder = make_request("holder", ["a", "b", "a"], [4, 4, 4])
    manager.allocate(holder, 0)
    manager.allocate(holder, 1)
    manager.check_and_update_cache(holder, 2)
    old = make_request("old", ["c"], [4])
    manager.allocate(old, 0)
    manager.free(old)
    return manager


@pytest.mark.parametrize("size", [-1, -100])
def test_negative_cache_size_is_a_value_error(manager_cls, size):
    with pytest.raises(ValueError, match="cache_size"):
        manager_cls(size)


@pytest.mark.parametrize("size", [1.5, "10", None, True])
def test_non_integer_cache_size_is_a_type_error(manager_cls, size):
    with pytest.raises(TypeError, match="cache_size"):
        manager_cls(size)


CALLS = {
    "check_and_update_cache": lambda m, r, i: m.check_and_update_cache(r, i),
    "get_cached_num_encoder_embeds": lambda m, r, i: m.get_cached_num_encoder_embeds(r, i),
    "can_allocate": lambda m, r, i: m.can_allocate(r, i, 100, 0),
    "allocate": lambda m, r, i: m.allocate(r, i),
    "free_encoder_input": lambda m, r, i: m.free_encoder_input(r, i),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("input_id", [3, 99, -1])
def test_input_id_out_of_range_is_an_index_error(manager_cls, call, input_id):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(IndexError):
        CALLS[call](manager, make_request("r", ["a", "x", "y"], [4, 1, 1]), input_id)
    assert state(manager) == before


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("input_id", ["0", 0.0, None])
def test_non_integer_input_id_is_a_type_error(manager_cls, call, input_id):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(TypeError):
        CALLS[call](manager, make_request("r", ["a"], [4]), input_id)
    assert state(manager) == before


@pytest.mark.parametrize("call", ["check_and_update_cache", "allocate", "get_cached_num_encoder_embeds"])
@pytest.mark.parametrize("identifier", [7, b"a", None])
def test_non_str_identifier_is_a_type_error(manager_cls, call, identifier):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(TypeError, match="identifier"):
        CALLS[call](manager, OddRequest("r", [identifier], [1]), 0)
    assert state(manager) == before


@pytest.mark.parametrize("call", ["check_and_update_cache", "allocate", "free_encoder_input"])
@pytest.mark.parametrize("request_id", [1, None, ("holder",)])
def test_non_str_request_id_is_a_type_error(manager_cls, call, request_id):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(TypeError, match="request_id"):
        CALLS[call](manager, OddRequest(request_id, ["a"], [4]), 0)
    with pytest.raises(TypeError, match="request_id"):
        manager.free(OddRequest(request_id, ["a"], [4]))
    with pytest.raises(TypeError, match="request_id"):
        manager.get_cached_input_ids(OddRequest(request_id, ["a"], [4]))
    assert state(manager) == before


@pytest.mark.parametrize("call", ["can_allocate", "allocate"])
@pytest.mark.parametrize(("size", "error"), [(-1, ValueError), (2.5, TypeError), ("3", TypeError), (None, TypeError)])
def test_bad_embed_counts_are_refused(manager_cls, call, size, error):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(error, match="get_num_encoder_embeds"):
        CALLS[call](manager, OddRequest("r", ["new"], [size]), 0)
    assert state(manager) == before


@pytest.mark.parametrize(("budget", "scheduled"), [(1.0, 0), (10, "0"), (None, 0)])
def test_non_integer_budgets_are_a_type_error(manager_cls, budget, scheduled):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(TypeError):
        manager.can_allocate(make_request("r", ["new"], [4]), 0, budget, scheduled)
    assert state(manager) == before


def test_allocate_without_room_is_refused_before_anything_changes(manager_cls):
    manager = busy_manager(manager_cls)  # 0 free slots, 4 reclaimable
    before = state(manager)
    with pytest.raises(ValueError, match="can_allocate"):
        manager.allocate(make_request("r", ["new"], [4]), 0)
    assert state(manager) == before


def test_allocate_with_a_different_embed_count_for_a_cached_item_is_refused(manager_cls):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(ValueError, match="cached with 4 embeddings"):
        manager.allocate(make_request("r", ["a"], [5]), 0)
    assert state(manager) == before


def test_allocate_of_an_already_cached_item_is_refused(manager_cls):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(ValueError, match="already cached"):
        manager.allocate(make_request("r", ["c"], [4]), 0)
    assert state(manager) == before


@pytest.mark.parametrize("call", ["can_allocate", "allocate"])
def test_an_exception_from_the_request_propagates_and_changes_nothing(manager_cls, call):
    manager = busy_manager(manager_cls)
    before = state(manager)
    with pytest.raises(Boom):
        CALLS[call](manager, OddRequest("r", ["new"], [Boom("sizes unavailable")]), 0)
    assert state(manager) == before


def test_a_raising_attribute_propagates_and_changes_nothing(manager_cls):
    class NoId(OddRequest):
        @property
        def request_id(self):
            raise Boom("no id yet")

        @request_id.setter
        def request_id(self, value):
            pass

    manager = busy_manager(manager_cls)
    before = state(manager)
    for call in ("check_and_update_cache", "allocate", "free_encoder_input"):
        with pytest.raises(Boom):
            CALLS[call](manager, NoId("r", ["a"], [4]), 0)
    with pytest.raises(Boom):
        manager.free(NoId("r", ["a"], [4]))
    assert state(manager) == before


def test_a_request_that_calls_back_into_the_manager_sees_a_consistent_state(manager_cls):
    manager = manager_cls(10)
    seen = []

    class Reentrant(OddRequest):
        def get_num_encoder_embeds(self, input_id):
            seen.append(manager.num_free_slots)
            manager.allocate(make_request("inner", ["inner"], [2]), 0)
            return super().get_num_encoder_embeds(input_id)

    manager.allocate(Reentrant("outer", ["outer"], [3]), 0)
    assert seen == [10]
    assert manager.cached == {"inner": {"inner"}, "outer": {"outer"}}
    assert manager.num_free_slots == 5


def test_encoder_decoder_manager_refuses_bad_input_too():
    manager = EncoderDecoderCacheManager(10)
    with pytest.raises(ValueError):
        EncoderDecoderCacheManager(-1)
    with pytest.raises(IndexError):
        manager.allocate(make_request("r", ["a"], [4]), 1)
    with pytest.raises(ValueError):
        manager.allocate(OddRequest("r", ["a"], [-4]), 0)
    with pytest.raises(TypeError):
        manager.allocate(OddRequest("r", [4], [4]), 0)
    # Frees give back what the request holds: sizes are not read again, so a failing size is never reached.
    manager.free(OddRequest("r", ["a", "b"], [4, Boom("late failure")]))
    with pytest.raises(Boom):
        manager.can_allocate(OddRequest("r", ["a", "b"], [4, Boom("late failure")]), 1, 100, 0)
    assert (manager.num_free_slots, manager.allocated) == (10, [])
    assert reference.EncoderDecoderCacheManager(10).num_free_slots == 10


@pytest.mark.parametrize("cls", [EncoderCacheManager, EncoderDecoderCacheManager])
@pytest.mark.parametrize("bad", [{"request_id": "r", "mm_features": []}, None], ids=["dict", "None"])
def test_a_request_of_another_shape_is_a_type_error_that_names_the_shape(cls, bad):
    manager = cls(10)
    calls = {
        "check_and_update_cache": lambda: manager.check_and_update_cache(bad, 0),
        "can_allocate": lambda: manager.can_allocate(bad, 0, 10, 0),
        "allocate": lambda: manager.allocate(bad, 0),
        "free": lambda: manager.free(bad),
        "try_schedule_encoder_inputs": lambda: manager.try_schedule_encoder_inputs(bad, 0, 4, 10),
    }
    if cls is EncoderDecoderCacheManager:
        del calls["check_and_update_cache"]  # never reads the request: nothing is ever cached
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"expected a request with `request_id`, `mm_features`") as raised:
            call()
        assert type(bad).__name__ in str(raised.value), name
    assert manager.snapshot() == cls(10).snapshot()
