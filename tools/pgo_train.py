"""The traffic a profile-guided build of the extension is trained on.

``make build`` and ``make wheel`` (tools/build_extension.sh) first build the
extension instrumented, run this script on it, and build it again with the
profile this run recorded (see docs/architecture.md). The compiler then lays out and inlines the code by
how often each path ran here. So this run should use the extension as
servers do, in the proportions they do:

- the per-call API as vLLM's own scheduler drives it (the manager hook):
  a simulated stream of requests with images, some with `is_embed` masks,
  items asked for first by `get_cached_num_encoder_embeds`, then checked,
  made room for and allocated; every running request asked
  `get_cached_input_ids` each step, consumed items freed one by one, finished
  requests freed, evictions drained; under every policy;
- a server that has run a while: under every policy, a small cache fed
  until every memory of evicted items is full (the re-encode counter's,
  `lfu-ghost`'s and `duel`'s counts, ARC's ghosts), so that each eviction
  also forgets one, as it does on a long-running server;
- the benchmarks' do-nothing stand-ins (`_CallFloor`, in builds with the
  test hooks), about as often as the manager's methods, so that the floor
  the benchmarks compare with is laid out as the methods beside it;
- the step-level API as our `Scheduler` drives it: the simulator's built-in
  engine on its chat, video and popular-images workloads, every policy, with
  and without lookahead, and once with a host tier.

It draws its own traffic, with seeds of its own, so it trains on none of the
benchmarks' cases. It prints one line: the totals and the extension it ran
on. It takes about 15 seconds.
"""

from __future__ import annotations

import contextlib
import io
import random
import sys

import encoder_cache
from encoder_cache import EncoderCacheManager, MultiModalFeature, PlaceholderRange, Request, _core
from encoder_cache.__main__ import main as cli
from encoder_cache.reference import EVICTED_MEMORY
from encoder_cache.reference.policies import ARC_GHOST_ITEMS, FREQUENCY_MEMORY

#: Steps of the per-call traffic per policy.
STEPS = 1_500


def _feature(rng: random.Random, identifier: str, offset: int) -> MultiModalFeature:
    length = rng.choice((16, 64, 144, 256, 576))
    mask = None
    if rng.random() < 0.3:  # images split into tiles with break tokens between them
        mask = [i % 17 != 16 for i in range(length)]
    return MultiModalFeature(
        identifier, PlaceholderRange(offset, length, mask), rng.choice(("image", "image", "video"))
    )


def _request(rng: random.Random, number: int, catalogue: int) -> Request:
    features, offset = [], rng.randrange(0, 64)
    for _ in range(rng.choice((1, 1, 2, 4, 8, 24))):
        item = min(int(rng.paretovariate(1.1)), catalogue) if rng.random() < 0.7 else rng.randrange(10**9)
        feature = _feature(rng, f"img-{item}", offset)
        features.append(feature)
        offset += feature.mm_position.length + rng.randrange(1, 40)
    return Request(f"req-{number}", features)


def per_call(policy: str, seed: int) -> int:
    """vLLM's scheduler loop over a stream of requests, through the per-call API; calls made."""
    rng = random.Random(seed)
    manager = EncoderCacheManager(8_192, policy=policy)
    budget, running, calls, number = 4_096, [], 0, 0
    for _ in range(STEPS):
        for _ in range(rng.choice((0, 0, 1, 2))):
            running.append([_request(rng, number, catalogue=400), 0])
            number += 1
        left = budget
        for entry in running:
            request, scheduled = entry
            while scheduled < len(request.mm_features):
                calls += 2
                if manager.get_cached_num_encoder_embeds(request, scheduled) is not None:
                    if not manager.check_and_update_cache(request, scheduled):
                        break
                else:
                    calls += 1
                    size = request.get_num_encoder_embeds(scheduled)
                    if not manager.can_allocate(request, scheduled, left, 0):
                        break
                    manager.allocate(request, scheduled)
                    left -= size
                scheduled += 1
            entry[1] = scheduled
        for entry in list(running):
            request, scheduled = entry
            held = manager.get_cached_input_ids(request)
            calls += 1
            for input_id in list(held):
                if input_id < scheduled - 1 or scheduled == len(request.mm_features):
                    manager.free_encoder_input(request, input_id)
                    calls += 1
            if scheduled == len(request.mm_features) and rng.random() < 0.3:
                manager.free(request)
                running.remove(entry)
                calls += 1
        manager.get_freed_mm_hashes()
        if rng.random() < 0.01:
            manager.stats()
        calls += 1
    for request, _ in running:
        manager.free(request)
    return calls


def long_running(policy: str, seed: int) -> int:
    """Requests of popular and new items through a small cache, until every
    memory of evicted items has forgotten some; calls made."""
    rng = random.Random(seed)
    manager = EncoderCacheManager(4_096, policy=policy)
    enough = max(EVICTED_MEMORY, ARC_GHOST_ITEMS, FREQUENCY_MEMORY) * 5 // 4
    calls = number = 0
    while number % 64 or manager.stats()["evictions"] < enough:
        features, offset = [], 0
        for _ in range(rng.randrange(8, 17)):
            item = f"pop-{int(rng.paretovariate(0.8))}" if rng.random() < 0.4 else f"new-{rng.randrange(10**12)}"
            length = rng.choice((32, 64, 96, 128))
            features.append(MultiModalFeature(item, PlaceholderRange(offset, length)))
            offset += length + 1
        request = Request(f"long-{number}", features)
        number += 1
        for i in range(len(features)):
            calls += 1
            if not manager.check_and_update_cache(request, i):
                calls += 2
                manager.can_allocate(request, i, 8_192, 0)
                manager.allocate(request, i)
        manager.get_freed_mm_hashes()
        manager.free(request)
        calls += 2
    return calls


def call_floors() -> int:
    """Every method of both `_CallFloor` forms on a set of requests; calls made (0 without them)."""
    floor_class = getattr(_core, "_CallFloor", None)
    if floor_class is None:
        return 0
    rng = random.Random(5)
    requests = [_request(rng, number, catalogue=400) for number in range(64)]
    calls = 0
    for reads in (False, True):
        floor = floor_class(reads=reads)
        for _ in range(100):
            for request in requests:
                for i in range(len(request.mm_features)):
                    floor.get_cached_num_encoder_embeds(request, i)
                    floor.check_and_update_cache(request, i)
                    floor.can_allocate(request, i, 4_096, 0)
                    floor.allocate(request, i)
                    floor.free_encoder_input(request, i)
                floor.get_cached_input_ids(request)
                floor.free(request)
                calls += 5 * len(request.mm_features) + 2
    return calls


def step_level() -> None:
    """The simulator's engine (our `Scheduler`'s calls) on its built-in workloads."""
    runs = [
        ["--workload", "chat", "--requests", "400", "--seed", "101"],
        ["--workload", "video", "--requests", "60", "--seed", "102"],
        ["--workload", "popular", "--requests", "400", "--seed", "103"],
        ["--workload", "mix", "--requests", "200", "--seed", "104", "--policy", "vllm", "--host-cache-gib", "1"],
    ]
    for args in runs:
        with contextlib.redirect_stdout(io.StringIO()):
            status = cli(["simulate", "--no-progress", "--jobs", "1", *args])
        if status:
            sys.exit(f"pgo_train: simulate {' '.join(args)} exited with {status}")


def main() -> None:
    calls = sum(per_call(policy, seed) for seed, policy in enumerate(encoder_cache.POLICIES, start=11))
    # vLLM's own order leads: a server on the default policy is what most runs are.
    calls += per_call("vllm", 7) + per_call("vllm", 8)
    calls += sum(long_running(policy, seed) for seed, policy in enumerate(encoder_cache.POLICIES, start=31))
    calls += call_floors()
    step_level()
    print(f"pgo_train: {calls:,} per-call API calls, 4 simulator runs, on {_core.__file__}")


if __name__ == "__main__":
    main()
