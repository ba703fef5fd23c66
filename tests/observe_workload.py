"""A scheduler-shaped workload for the metrics and events tests: steps of new
requests over a small pool of image, audio and video items, so the cache
hits, misses, evicts and re-encodes; items are freed as requests finish.

Run as a script (``python tests/observe_workload.py OUT.json``) it drives an
observed manager with its metrics in this process's registry (multiprocess
mode when ``PROMETHEUS_MULTIPROC_DIR`` is set), publishes its metrics once and
writes ``stats()`` and ``cache_size`` to OUT.json.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from encoder_cache import MultiModalFeature, PlaceholderRange, Request

MODALITIES = ("image", "audio", "video")


def pool(seed: int, size: int = 24) -> list[tuple[str, int, str]]:
    rng = random.Random(seed)
    return [(f"item{n}", rng.choice((8, 16, 24, 40)), MODALITIES[n % 3]) for n in range(size)]


def make_request(request_id: str, items: list[tuple[str, int, str]]) -> Request:
    features = []
    offset = 0
    for identifier, size, modality in items:
        features.append(MultiModalFeature(identifier, PlaceholderRange(offset, size), modality))
        offset += size + 2
    return Request(request_id, features)


def run_steps(manager: Any, steps: int, seed: int, per_step: int = 3) -> None:
    """``steps`` scheduler steps: schedule new requests whole, end the step
    (``get_freed_mm_hashes``), then finish them."""
    rng = random.Random(seed)
    items = pool(seed)
    n = 0
    for _ in range(steps):
        scheduled = []
        for _ in range(per_step):
            request = make_request(f"r{n}", rng.sample(items, rng.randint(1, 3)))
            n += 1
            last = request.mm_features[-1].mm_position
            window = last.offset + last.length
            to_encode, num_new, _, _, repeated = manager.try_schedule_encoder_inputs(request, 0, window, 10**6)
            if num_new == window:
                manager.allocate_encoder_inputs(request, to_encode, repeated)
                scheduled.append(request)
            else:
                manager.free(request)
        manager.get_freed_mm_hashes()
        for request in scheduled:
            manager.free(request)


def main(out: str) -> None:
    from encoder_cache import EncoderCacheManager
    from encoder_cache.metrics import CacheMetrics
    from encoder_cache.observed import StepObservers, observed_class

    manager = observed_class(EncoderCacheManager)(96)
    manager.observers = StepObservers(metrics=CacheMetrics(model_name="m", engine=3), metrics_interval=0.0)
    run_steps(manager, 40, seed=1)
    before_reset = manager.stats()
    manager.reset_stats()  # the manager counts from zero; the exported counters keep growing
    run_steps(manager, 40, seed=2)
    manager.observers.update_metrics(manager)
    manager.cache_size = 80  # shrinking evicts: the capacity gauge follows
    manager.observers.update_metrics(manager)
    with open(out, "w") as f:
        json.dump({"before_reset": before_reset, "stats": manager.stats(), "cache_size": manager.cache_size}, f)


if __name__ == "__main__":
    main(sys.argv[1])
