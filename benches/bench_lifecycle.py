"""Whole requests: what the scheduler does per item, summed over a request.

- lifecycle: a request with 64 items is scheduled item by item (check for a
  hit, can_allocate, allocate) and then finished with ``free(request)``;
- long video: one request with 4,096 distinct frames is scheduled, then its
  frames are freed one by one, as the scheduler frees each once the model has
  read it. The any()-scan variant (vLLM PR #54284 as first written) scans the
  request's remaining inputs on every free, so its cost grows as k^2.

``floor`` drives the same calls into PyO3 methods that do nothing (its check
never hits, so every item takes all three calls): what the calls cost before
any manager does any work, so no per-call manager can beat it.

Each round starts from a fresh manager (built outside the timing).
"""

from __future__ import annotations

import pytest
from workloads import CACHE_SIZE, MANAGERS, floor, make_request, schedule

from encoder_cache.reference import AnyScanEncoderCacheManager

LIFECYCLE = [*MANAGERS, "floor"]
LONG_VIDEO = [*MANAGERS, "anyscan", "floor"]
NUM_FRAMES = 4096


def new_manager(impl: str):
    if impl == "floor":
        return floor()
    if impl == "anyscan":
        return AnyScanEncoderCacheManager(CACHE_SIZE)
    return MANAGERS[impl](CACHE_SIZE)


def run_pedantic(benchmark, impl, target, setup, rounds):
    # The any-scan variant takes about a second per round: fewer rounds say enough.
    benchmark.pedantic(target, setup=setup, rounds=max(2, rounds // 10) if impl == "anyscan" else rounds)


def all_released(impl, manager) -> bool:
    return impl == "floor" or manager.num_freeable_slots == CACHE_SIZE


@pytest.mark.benchmark(group="lifecycle: 64 items scheduled, then free(request)")
@pytest.mark.parametrize("impl", LIFECYCLE)
def bench_request_lifecycle(benchmark, impl):
    req = make_request("req-64", 64)

    def lifecycle(manager):
        schedule(manager, req)
        manager.free(req)
        assert all_released(impl, manager)

    run_pedantic(benchmark, impl, lifecycle, lambda: ((new_manager(impl),), {}), rounds=200)


def free_one_by_one(impl, manager, req):
    for i in range(len(req.mm_features)):
        manager.free_encoder_input(req, i)
    assert all_released(impl, manager)


@pytest.mark.benchmark(group="long video: 4096 frames scheduled, then freed one by one")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video(benchmark, impl):
    req = make_request("req-video", NUM_FRAMES, size=16)

    def video(manager):
        schedule(manager, req)
        free_one_by_one(impl, manager, req)

    run_pedantic(benchmark, impl, video, lambda: ((new_manager(impl),), {}), rounds=20)


@pytest.mark.benchmark(group="long video: the 4096 frees alone")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video_frees(benchmark, impl):
    req = make_request("req-video", NUM_FRAMES, size=16)

    def setup():
        manager = new_manager(impl)
        schedule(manager, req)
        return (impl, manager, req), {}

    run_pedantic(benchmark, impl, free_one_by_one, setup, rounds=20)
