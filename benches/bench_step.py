"""One scheduler step for one request whose items are all cached: the Rust
step-level call against vLLM 0.33 scheduler's per-item loop over vLLM's own
manager (``vllm``, see ``vllm_baseline.py``) and over the pure-Python twin
(``python``), side by side in the same run.

- ``schedule``: ``try_schedule_encoder_inputs`` alone (every item a cache hit);
- ``schedule+free``: the same, then ``free_encoder_inputs_before`` with nothing
  yet consumed, which is what every running request costs per step.

With benchmarking disabled each case runs once and checks the result.
"""

from __future__ import annotations

from typing import Any

import pytest
from workloads import STEP_MANAGERS

from encoder_cache import MultiModalFeature, PlaceholderRange, Request

IMPLEMENTATIONS = STEP_MANAGERS
ITEM_TOKENS = 64
GAP = 8  # text tokens between items
BUDGET = 10**6


def cached_request(num_items: int, cls: type) -> tuple[Any, Request, int]:
    """A manager holding all ``num_items`` distinct items of one request, and
    the window that covers them."""
    features = [
        MultiModalFeature(f"item{i}", PlaceholderRange(i * (ITEM_TOKENS + GAP), ITEM_TOKENS)) for i in range(num_items)
    ]
    request = Request("r", features)
    window = num_items * (ITEM_TOKENS + GAP)
    manager = cls(num_items * ITEM_TOKENS)
    to_encode, *_ = manager.try_schedule_encoder_inputs(request, 0, window, BUDGET)
    manager.allocate_encoder_inputs(request, to_encode, [])
    return manager, request, window


def schedule_and_free(manager: Any, request: Request, window: int) -> Any:
    return manager.try_schedule_encoder_inputs(request, 0, window, BUDGET), manager.free_encoder_inputs_before(
        request, 0
    )


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("num_items", [1, 16, 64])
@pytest.mark.parametrize("step", ["schedule", "schedule+free"])
def test_step_all_cached(benchmark: Any, step: str, num_items: int, impl: str) -> None:
    manager, request, window = cached_request(num_items, IMPLEMENTATIONS[impl])
    benchmark.group = f"{step} {num_items:>2} cached items"
    benchmark.extra_info["items"] = num_items
    hits_only = ([], window, BUDGET, [], [])
    if step == "schedule":
        # The call itself, as the scheduler makes it: no wrapper frame.
        assert benchmark(manager.try_schedule_encoder_inputs, request, 0, window, BUDGET) == hits_only
    else:
        assert benchmark(schedule_and_free, manager, request, window) == (hits_only, [])
    assert manager.request_cached_ids == {"r": set(range(num_items))}


def test_vllm_loops_agree_with_the_step_api() -> None:
    """The step-level baseline is faithful: vLLM's per-item loops over vLLM's
    module and our Rust step-level calls make the same choices and leave the
    same cache, step by step, through chunked prefill, hits and evictions."""
    import random

    import vllm_baseline
    from workloads import vllm_step_manager

    import encoder_cache

    rng = random.Random(5)
    pool = [(f"img{n}", rng.choice((8, 16, 24))) for n in range(12)]
    managers = {"vllm": vllm_step_manager(96), "rust": encoder_cache.EncoderCacheManager(96)}
    assert isinstance(managers["vllm"], vllm_baseline.SchedulerLoops)
    steps = evicted = 0
    for n in range(60):
        features, offset = [], rng.randint(0, 5)
        for identifier, size in rng.sample(pool, rng.randint(1, 4)):
            features.append(MultiModalFeature(identifier, PlaceholderRange(offset, size)))
            offset += size + rng.randint(0, 6)
        request = Request(f"r{n}", features)
        computed = 0
        while computed < offset:
            window = min(rng.randint(4, 40), offset - computed)
            results = {
                name: m.try_schedule_encoder_inputs(request, computed, window, 48) for name, m in managers.items()
            }
            assert results["vllm"] == results["rust"], (n, computed)
            to_encode, num_new, _, _, repeated = results["rust"]
            freed = {}
            for name, manager in managers.items():
                manager.allocate_encoder_inputs(request, to_encode, repeated)
                freed[name] = sorted(manager.free_encoder_inputs_before(request, computed + num_new))
            assert freed["vllm"] == freed["rust"]
            state = {
                name: (m.num_free_slots, m.num_freeable_slots, list(m.freeable.items())) for name, m in managers.items()
            }
            assert state["vllm"] == state["rust"], (n, computed)
            steps += 1
            if not num_new:
                break  # the cache cannot take the next item now
            computed += num_new
        hashes = {}
        for name, manager in managers.items():
            manager.free(request)
            hashes[name] = manager.get_freed_mm_hashes()
        assert hashes["vllm"] == hashes["rust"]
        evicted += len(hashes["rust"])
    assert steps > 100 and evicted > 0
