"""The per-item methods of the Rust EncoderCacheManager enter Rust through fast
entries that take a request and plain ints, positionally, and hand every
other call (keywords, other counts, other number types) to PyO3's own method.
Both ways in must be one method: the same results, state, errors, name and
signature."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from conftest import make_request, state

from encoder_cache import EncoderCacheManager, reference


class Index(int):
    """An int subclass, as an enum or a framework's index type would be."""


def positional(value):
    return value


def run_scenario(manager, call, number=positional) -> list:
    """Every fast method, with repeats, a hit, a release and an eviction;
    ``call(manager, name, request, *ints)`` makes each call, with each int
    passed through ``number``."""
    chat = make_request("chat", ["a", "b", "a"], [4, 4, 4])
    other = make_request("other", ["c", "b"], [6, 4])
    results = []

    def do(name, request, *ints):
        results.append(call(manager, name, request, *(number(i) for i in ints)))
        return results[-1]

    for i in range(3):  # as vLLM's scheduler: a hit, or room made and the item allocated
        if not do("check_and_update_cache", chat, i) and do("can_allocate", chat, i, 100, 0):
            do("allocate", chat, i)
    do("get_cached_num_encoder_embeds", chat, 1)
    results.append(sorted(call(manager, "get_cached_input_ids", chat)))
    do("free_encoder_input", chat, 0)
    do("check_and_update_cache", other, 1)
    do("can_allocate", other, 0, 100, 4)
    do("allocate", other, 0)
    call(manager, "free", chat)
    do("can_allocate", make_request("late", ["d"], [8]), 0, 100, 0)
    results.append(sorted(call(manager, "get_cached_input_ids", other)))
    return results


def by_position(manager, name, request, *ints):
    return getattr(manager, name)(request, *ints)


PARAMETERS = {
    "check_and_update_cache": ["input_id"],
    "can_allocate": ["input_id", "encoder_compute_budget", "num_embeds_to_schedule"],
    "allocate": ["input_id"],
    "get_cached_num_encoder_embeds": ["input_id"],
    "get_cached_input_ids": [],
    "free_encoder_input": ["input_id"],
    "free": [],
}


def by_keyword(manager, name, request, *ints):
    return getattr(manager, name)(request=request, **dict(zip(PARAMETERS[name], ints, strict=True)))


def expected():
    manager = reference.EncoderCacheManager(20)
    return run_scenario(manager, by_position), state(manager)


@pytest.mark.parametrize(
    ("call", "number"),
    [(by_position, positional), (by_keyword, positional), (by_position, Index), (by_position, np.int64)],
    ids=["positional", "keywords", "int subclass", "numpy int"],
)
def test_every_way_of_calling_gives_vllms_results_and_state(call, number):
    manager = EncoderCacheManager(20)
    assert (run_scenario(manager, call, number), state(manager)) == expected()


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda m, r: m.check_and_update_cache(r), TypeError, "missing 1 required positional argument: 'input_id'"),
        (lambda m, r: m.allocate(r, 0, 1), TypeError, "takes 2 positional arguments but 3 were given"),
        (lambda m, r: m.can_allocate(r, 0, 100, num_embeds=0), TypeError, "unexpected keyword argument 'num_embeds'"),
        (lambda m, r: m.free(), TypeError, "missing 1 required positional argument: 'request'"),
        (lambda m, r: m.check_and_update_cache(r, 2**70), OverflowError, "too large"),
        (lambda m, r: m.can_allocate(r, 0, -(2**70), 0), OverflowError, "too large"),
        (lambda m, r: EncoderCacheManager.allocate(object(), r, 0), TypeError, "doesn't apply to a 'object' object"),
    ],
)
def test_calls_the_fast_entry_does_not_take_get_pyo3s_errors_and_change_nothing(call, error, words):
    manager = EncoderCacheManager(20)
    run_scenario(manager, by_position)
    before = state(manager)
    with pytest.raises(error, match=words):
        call(manager, make_request("r", ["a"], [4]))
    assert state(manager) == before


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_each_method_keeps_its_name_and_signature(name):
    method = getattr(EncoderCacheManager, name)
    assert method.__qualname__ == f"EncoderCacheManager.{name}"
    assert list(inspect.signature(method).parameters) == ["self", "request", *PARAMETERS[name]]


def test_a_subclass_can_override_a_method_and_call_it_through_super():
    class Counting(EncoderCacheManager):
        calls = 0

        def check_and_update_cache(self, request, input_id):
            Counting.calls += 1
            return super().check_and_update_cache(request, input_id)

    manager = Counting(20)
    assert (run_scenario(manager, by_position), state(manager)) == expected()
    assert Counting.calls == 4
