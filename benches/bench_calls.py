"""Per call on a warm cache: one request holds 8 cached items, and each case
repeats one manager call that leaves the state as it found it.

``floor`` is a PyO3 method with the same arguments that does nothing: no call
into Rust can be cheaper. ``reads`` also reads from the request what vLLM's
manager reads on every call (the Rust manager keeps what it read instead).
"""

from __future__ import annotations

import pytest
from workloads import BUDGET, CACHE_SIZE, FLOORS, MANAGERS, floor, make_request, schedule

INPUT = 3
IMPLEMENTATIONS = [*MANAGERS, *FLOORS]


@pytest.fixture(params=IMPLEMENTATIONS)
def warm(request):
    """(implementation, manager, request) with all 8 items of the request cached and held."""
    req = make_request("req-warm", 8)
    if request.param in FLOORS:
        return request.param, floor(request.param), req
    manager = MANAGERS[request.param](CACHE_SIZE)
    schedule(manager, req)
    return request.param, manager, req


@pytest.mark.benchmark(group="check_and_update_cache (hit)")
def bench_check_and_update_cache_hit(benchmark, warm):
    impl, manager, req = warm
    hit = benchmark(manager.check_and_update_cache, req, INPUT)
    assert hit is (impl in MANAGERS)


@pytest.mark.benchmark(group="can_allocate (fits)")
def bench_can_allocate_fits(benchmark, warm):
    impl, manager, req = warm
    fits = benchmark(manager.can_allocate, req, INPUT, BUDGET, 0)
    assert fits is (impl in MANAGERS)


@pytest.mark.benchmark(group="get_cached_num_encoder_embeds")
def bench_get_cached_num_encoder_embeds(benchmark, warm):
    impl, manager, req = warm
    n = benchmark(manager.get_cached_num_encoder_embeds, req, INPUT)
    assert n == (64 if impl in MANAGERS else None)


@pytest.mark.benchmark(group="get_cached_input_ids")
def bench_get_cached_input_ids(benchmark, warm):
    impl, manager, req = warm
    ids = benchmark(manager.get_cached_input_ids, req)
    assert ids == (set(range(8)) if impl in MANAGERS else None)


@pytest.mark.benchmark(group="free_encoder_input + check_and_update_cache")
def bench_release_reacquire(benchmark, warm):
    impl, manager, req = warm
    free, check = manager.free_encoder_input, manager.check_and_update_cache

    def cycle():
        free(req, INPUT)  # the item's last holder lets go: it becomes evictable
        return check(req, INPUT)  # and is taken back off the eviction list

    benchmark(cycle)
    if impl in MANAGERS:
        assert manager.get_cached_input_ids(req) == set(range(8))
        assert manager.num_freeable_slots == CACHE_SIZE - 8 * 64
