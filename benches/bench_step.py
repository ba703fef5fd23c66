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
