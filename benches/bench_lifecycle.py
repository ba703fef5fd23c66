"""Whole requests: what the scheduler does per item, summed over a request.

- lifecycle: a request with 64 items is scheduled item by item (check for a
  hit, can_allocate, allocate) and then finished with ``free(request)``;
- long video: one request with 4,096 distinct frames is scheduled, then its
  frames are freed one by one, as the scheduler frees each once the model has
  read it. The any()-scan variant (vLLM PR #54284 as first written) scans the
  request's remaining inputs on every free, so its cost grows as k^2.

Like a server's, the manager lives across rounds and its cache is full: each
round brings a new request with new items (built outside the timing), whose
can_allocate calls evict the oldest released items of earlier rounds.

``floor`` drives the same calls into PyO3 methods that do nothing (its check
never hits, so every item takes all three calls), and ``reads`` into methods
that only read from the request what the manager reads: what the calls cost
before any manager does any work, so no per-call manager can beat them.
"""

from __future__ import annotations

import itertools

import pytest
from workloads import FLOORS, MANAGERS, floor, make_request, schedule

from encoder_cache.reference import AnyScanEncoderCacheManager

LIFECYCLE = [*MANAGERS, *FLOORS]
LONG_VIDEO = [*MANAGERS, "anyscan", *FLOORS]
NUM_FRAMES = 4096
FRAME_SIZE = 16


class Rounds:
    """A long-lived manager (room for two requests) and a new request per round."""

    def __init__(self, impl: str, num_items: int, size: int) -> None:
        self.impl, self.num_items, self.size = impl, num_items, size
        if impl in FLOORS:
            self.manager = floor(impl)
        else:
            cls = AnyScanEncoderCacheManager if impl == "anyscan" else MANAGERS[impl]
            self.manager = cls(2 * num_items * size)
        self.counter = itertools.count()

    def next_request(self):
        if self.impl not in FLOORS:
            self.manager.get_freed_mm_hashes()  # the scheduler drains evictions every step
        n = next(self.counter)
        return make_request(f"req-{n}", self.num_items, self.size, first_item=n * self.num_items)

    def all_released(self) -> bool:
        return self.impl in FLOORS or not self.manager.request_cached_ids

    def run(self, benchmark, target, setup, rounds: int) -> None:
        # The any-scan variant takes about a second per round: fewer rounds say enough.
        rounds = max(2, rounds // 10) if self.impl == "anyscan" else rounds
        # Two warm-up rounds fill the cache, so every timed round evicts.
        benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=2)


@pytest.mark.benchmark(group="lifecycle: 64 items scheduled, then free(request)")
@pytest.mark.parametrize("impl", LIFECYCLE)
def bench_request_lifecycle(benchmark, impl):
    rounds = Rounds(impl, 64, 64)
    manager = rounds.manager

    def lifecycle(req):
        schedule(manager, req)
        manager.free(req)

    rounds.run(benchmark, lifecycle, lambda: ((rounds.next_request(),), {}), rounds=200)
    assert rounds.all_released()


def free_one_by_one(manager, req):
    for i in range(len(req.mm_features)):
        manager.free_encoder_input(req, i)


@pytest.mark.benchmark(group="long video: 4096 frames scheduled, then freed one by one")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video(benchmark, impl):
    rounds = Rounds(impl, NUM_FRAMES, FRAME_SIZE)
    manager = rounds.manager

    def video(req):
        schedule(manager, req)
        free_one_by_one(manager, req)

    rounds.run(benchmark, video, lambda: ((rounds.next_request(),), {}), rounds=20)
    assert rounds.all_released()


@pytest.mark.benchmark(group="long video: the 4096 frees alone")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video_frees(benchmark, impl):
    rounds = Rounds(impl, NUM_FRAMES, FRAME_SIZE)
    manager = rounds.manager

    def setup():
        req = rounds.next_request()
        schedule(manager, req)
        return (manager, req), {}

    rounds.run(benchmark, free_one_by_one, setup, rounds=20)
    assert rounds.all_released()
