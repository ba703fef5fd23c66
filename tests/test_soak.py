"""Memory soak: millions of scheduler-like operations over churning requests,
with resident memory and Python object counts required flat after warm-up.

Not part of the default run (marker `soak`). Run it with:

    .venv/bin/python -m pytest -m soak tests/test_soak.py -s

ENCODER_CACHE_SOAK_OPS sets the number of manager calls (default 10 million).
"""

from __future__ import annotations

import gc
import os
import random
import resource
from collections import deque

import pytest

from encoder_cache import EncoderCacheManager, MultiModalFeature, PlaceholderRange, Request

OPS = int(os.environ.get("ENCODER_CACHE_SOAK_OPS", "10000000"))
CHECKPOINTS = 20
#: Growth allowed between the end of warm-up and the end: allocator noise, far
#: below what a leak of even 1 byte per operation would add over the run.
RSS_SLACK = 4 << 20
OBJECT_SLACK = 200


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def object_count() -> int:
    gc.collect()
    return len(gc.get_objects())


class Churn:
    """A scheduler's view: requests arrive, their items are looked up,
    allocated (evicting as needed) and freed input by input, then they
    finish; a bounded window of requests is live at any time."""

    def __init__(self, manager: EncoderCacheManager, seed: int = 0) -> None:
        self.manager, self.rng = manager, random.Random(seed)
        # 4000 distinct items of 16-255 embeddings; the cache holds a few dozen.
        self.items = [(f"item-{i}", 16 + (i * 37) % 240) for i in range(4000)]
        self.live: deque[Request] = deque()
        self.next_id = 0
        self.ops = self.hits = self.allocations = self.evictions = 0

    def new_request(self) -> Request:
        rng, n = self.rng, len(self.items)
        # Half popular items (hits), half from the whole pool (misses that evict).
        picks = [
            int(rng.paretovariate(1.2)) % n if rng.random() < 0.5 else rng.randrange(n)
            for _ in range(rng.randint(1, 4))
        ]
        features, offset = [], 0
        for i in picks:
            identifier, length = self.items[i]
            features.append(MultiModalFeature(identifier, PlaceholderRange(offset, length)))
            offset += length + 8
        self.next_id += 1
        return Request(f"req-{self.next_id}", features)

    def per_item(self) -> None:
        """One request through the per-item API, as vLLM 0.33's scheduler calls it."""
        m = self.manager
        request = self.new_request()
        for i in range(len(request.mm_features)):
            self.ops += 1
            if m.check_and_update_cache(request, i):
                self.hits += 1
                continue
            self.ops += 1
            if m.can_allocate(request, i, 4096, 0):
                self.ops += 1
                self.allocations += 1
                m.allocate(request, i)
        self.live.append(request)
        if len(self.live) > 48:
            done = self.live.popleft()
            self.ops += 1
            if m.get_cached_input_ids(done):
                self.ops += 1
                m.free_encoder_input(done, 0)
            self.ops += 1
            m.free(done)
        self.report_freed()

    def step_level(self) -> None:
        """One request through the step-level API: scheduled, allocated, its
        consumed inputs freed, finished."""
        m = self.manager
        request = self.new_request()
        end = request.mm_features[-1].mm_position.offset + request.mm_features[-1].mm_position.length
        self.ops += 1
        to_encode, _, _, _, repeated = m.try_schedule_encoder_inputs(request, 0, end, 4096)
        self.hits += len(request.mm_features) - len(to_encode)
        self.ops += 1
        m.allocate_encoder_inputs(request, to_encode, repeated)
        self.allocations += len(to_encode)
        self.live.append(request)
        if len(self.live) > 48:
            done = self.live.popleft()
            self.ops += 2
            m.free_encoder_inputs_before(done, done.mm_features[0].mm_position.length)
            m.free(done)
        self.report_freed()

    def report_freed(self) -> None:
        if self.next_id % 16 == 0:
            self.ops += 1
            self.evictions += len(self.manager.get_freed_mm_hashes())


@pytest.mark.soak
@pytest.mark.parametrize("api", ["per_item", "step_level"])
def test_memory_is_flat_over_millions_of_operations(api):
    manager = EncoderCacheManager(cache_size=6000)
    churn = Churn(manager)
    run = getattr(churn, api)
    samples = []
    for checkpoint in range(1, CHECKPOINTS + 1):
        while churn.ops < OPS * checkpoint // CHECKPOINTS:
            run()
        manager.check_invariants()
        samples.append((churn.ops, resident_bytes(), object_count()))
    _warm_ops, warm_rss, warm_objects = samples[1]  # after the first 10% of the run
    end_ops, end_rss, end_objects = samples[-1]
    print(
        f"\nsoak ({api} API): {end_ops} operations over {churn.next_id} requests: {churn.hits} hits, "
        f"{churn.allocations} allocations, {churn.evictions} evictions reported"
    )
    for ops, rss, objects in samples:
        print(f"  after {ops:>10} ops: RSS {rss / 2**20:8.2f} MiB, {objects} Python objects")
    print(
        f"  growth after warm-up: RSS {(end_rss - warm_rss) / 2**10:+.0f} KiB, objects {end_objects - warm_objects:+d}"
    )
    assert end_ops >= OPS
    assert end_rss - warm_rss <= RSS_SLACK, f"resident memory grew by {end_rss - warm_rss} bytes after warm-up"
    assert abs(end_objects - warm_objects) <= OBJECT_SLACK, f"{end_objects - warm_objects} more Python objects"
