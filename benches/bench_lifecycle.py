"""Whole requests: what the scheduler does per item, summed over a request.

- lifecycle: a request with 64 items is scheduled item by item (check for a
  hit, can_allocate, allocate) and then finished with ``free(request)``;
- long video: one request with 4,096 distinct frames is scheduled, then its
  frames are freed one by one, as the scheduler frees each once the model has
  read it, and then the request is finished with ``free(request)``. The
  any()-scan variant (vLLM PR #54284 as first written) scans the request's
  remaining inputs on every free, so its cost grows as k^2;
- long video, chunked prefill: the same request as our Scheduler runs it, one
  step-level call of each kind per step of 2,048 tokens (for vLLM's module:
  its scheduler's per-item loops, ``vllm_baseline.SchedulerLoops``) (vLLM's default
  max_num_batched_tokens and so encoder budget): schedule the chunk's frames,
  allocate them, and free those the chunk consumed; then ``free(request)``.
  A frame is held only until its chunk is done, so the any() scan looks at
  one chunk's frames (about 120), not the whole video's. The floor and reads
  stand-ins below have no step-level methods, so this case runs without them.

Every request ends with ``free(request)``, as vLLM's scheduler ends every
request it finishes, aborts or preempts (for vLLM's module a no-op once the
request holds nothing; the Rust manager drops what it recorded of the
request then).

Like a server's, the manager lives across rounds and its cache is full: each
round brings a new request with new items (built outside the timing), whose
can_allocate calls evict the oldest released items of earlier rounds.

``floor`` drives the same calls into PyO3 methods that do nothing (its check
never hits, so every item takes all three calls): no per-call manager can beat
it. ``reads`` drives them into methods that only read from the request what
vLLM's manager reads on every call: what a manager that reads as vLLM's does
pays before any work (the Rust one keeps what it read, and can beat it).
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest
from workloads import FLOORS, MANAGERS, STEP_MANAGERS, floor, make_request, schedule

from encoder_cache.budget import SchedulerConfig, compute_mm_encoder_budget
from encoder_cache.reference import AnyScanEncoderCacheManager

LIFECYCLE = [*MANAGERS, *FLOORS]
LONG_VIDEO = [*MANAGERS, "anyscan", *FLOORS]
NUM_FRAMES = 4096
FRAME_SIZE = 16
#: vLLM's default max_num_batched_tokens; the encoder budget follows from it,
#: and covers a chunk's frames (16 embeddings per 17 tokens), so no step is cut.
CHUNK = 2048
ENCODER_BUDGET, _ = compute_mm_encoder_budget(SchedulerConfig(CHUNK), {"video": FRAME_SIZE})


class Rounds:
    """A long-lived manager (room for two requests) and a new request per round."""

    def __init__(self, impl: str, num_items: int, size: int, managers=MANAGERS) -> None:
        self.impl, self.num_items, self.size = impl, num_items, size
        if impl in FLOORS:
            self.manager = floor(impl)
        else:
            cls = AnyScanEncoderCacheManager if impl == "anyscan" else managers[impl]
            self.manager = cls(2 * num_items * size)
        self.counter = itertools.count()

    def next_request(self):
        if self.impl not in FLOORS:
            self.manager.get_freed_mm_hashes()  # the scheduler drains evictions every step
        n = next(self.counter)
        return make_request(f"req-{n}", self.num_items, self.size, first_item=n * self.num_items)

    def run(self, benchmark, target, rounds: int, setup=None):
        """Time ``target``, by default called with a new request per round;
        return its last result, once every request has been released."""
        setup = setup or (lambda: ((self.next_request(),), {}))
        # The any() scan is slow (up to a second a round for the per-call video): fewer rounds say enough.
        rounds = max(2, rounds // 10) if self.impl == "anyscan" else rounds
        # Two warm-up rounds fill the cache, so every timed round evicts.
        result = benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=2)
        assert self.impl in FLOORS or not self.manager.request_cached_ids
        return result


def lifecycle(manager, req) -> None:
    schedule(manager, req)
    manager.free(req)


@pytest.mark.benchmark(group="lifecycle: 64 items scheduled, then free(request)")
@pytest.mark.parametrize("impl", LIFECYCLE)
def bench_request_lifecycle(benchmark, impl):
    rounds = Rounds(impl, 64, 64)
    rounds.run(benchmark, partial(lifecycle, rounds.manager), rounds=200)


def free_one_by_one(manager, req) -> None:
    for i in range(len(req.mm_features)):
        manager.free_encoder_input(req, i)


def frees_then_free(manager, req) -> None:
    free_one_by_one(manager, req)
    manager.free(req)


def long_video(manager, req) -> None:
    schedule(manager, req)
    frees_then_free(manager, req)


@pytest.mark.benchmark(group="long video: 4096 frames scheduled, then freed one by one")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video(benchmark, impl):
    rounds = Rounds(impl, NUM_FRAMES, FRAME_SIZE)
    rounds.run(benchmark, partial(long_video, rounds.manager), rounds=20)


@pytest.mark.benchmark(group="long video: the 4096 frees, then free(request)")
@pytest.mark.parametrize("impl", LONG_VIDEO)
def bench_long_video_frees(benchmark, impl):
    rounds = Rounds(impl, NUM_FRAMES, FRAME_SIZE)
    manager = rounds.manager

    def setup():
        req = rounds.next_request()
        schedule(manager, req)
        return (manager, req), {}

    rounds.run(benchmark, frees_then_free, rounds=20, setup=setup)


def chunked_prefill(manager, req) -> tuple[int, int]:
    """Compute the request a chunk per step, as our Scheduler drives the
    manager; return how many frames were encoded and how many freed."""
    last = req.mm_features[-1].mm_position
    num_tokens = last.offset + last.length
    computed = encoded = freed = 0
    while computed < num_tokens:
        to_encode, num_new, _, _, repeated = manager.try_schedule_encoder_inputs(
            req, computed, min(CHUNK, num_tokens - computed), ENCODER_BUDGET
        )
        assert num_new, "the step scheduled nothing"  # else this would never end
        manager.allocate_encoder_inputs(req, to_encode, repeated)
        computed += num_new  # the model has read the chunk
        encoded += len(to_encode)
        freed += len(manager.free_encoder_inputs_before(req, computed))
    manager.free(req)
    return encoded, freed


@pytest.mark.benchmark(group="long video, chunked prefill: 4096 frames, step-level calls per 2048 tokens")
@pytest.mark.parametrize("impl", [*STEP_MANAGERS, "anyscan"])
def bench_long_video_steps(benchmark, impl):
    rounds = Rounds(impl, NUM_FRAMES, FRAME_SIZE, STEP_MANAGERS)
    # Each frame encoded once (allocating one twice raises) and freed once.
    assert rounds.run(benchmark, partial(chunked_prefill, rounds.manager), rounds=50) == (NUM_FRAMES, NUM_FRAMES)
