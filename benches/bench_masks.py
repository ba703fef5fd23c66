"""Reading an item's ``is_embed`` mask (a torch bool tensor, as vLLM builds
it) at first sight, by length: the ways to read it in one call, and the first
step-level call for a request with one masked item against vLLM 0.33
scheduler's per-item loop over vLLM's own manager (``vllm``), which calls the
placeholder's ``get_num_embeds()`` (its first call runs torch's ``cumsum``).

- ``read: tolist+bytes``, ``read: numpy+bytes``, ``read: numpy().tobytes()``:
  the mask's bytes through each route (the bindings take the first for
  masks of up to 128 entries, the last for longer ones);
- ``first sight``: one step-level call for a request and placeholder never
  seen before, each round on fresh objects (``vllm`` and ``rust``).

Needs torch (vLLM's environment); skipped without it. With benchmarking
disabled each case runs once and checks its result.
"""

from __future__ import annotations

from typing import Any

import pytest
from workloads import STEP_MANAGERS

from encoder_cache import Request

torch = pytest.importorskip("torch")
vllm_inputs = pytest.importorskip("vllm.multimodal.inputs")

LENGTHS = [24, 48, 128, 600, 4096]
BUDGET = 1 << 40
ROUNDS = 2000


def mask_of(length: int) -> Any:
    """A mask with a break token every eighth entry, Qwen-VL style."""
    return torch.tensor([i % 8 != 7 for i in range(length)], dtype=torch.bool)


READS = {
    "tolist+bytes": lambda mask: bytes(mask.tolist()),
    "numpy+bytes": lambda mask: bytes(mask.numpy()),
    "numpy().tobytes()": lambda mask: mask.numpy().tobytes(),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("route", list(READS))
def test_read_mask(benchmark: Any, route: str, length: int) -> None:
    mask = mask_of(length)
    benchmark.group = f"mask of {length:>4} entries"
    assert benchmark(READS[route], mask) == bytes(mask.tolist())


def fresh_request(length: int) -> Request:
    position = vllm_inputs.PlaceholderRange(offset=0, length=length, is_embed=mask_of(length))
    feature = vllm_inputs.MultiModalFeatureSpec(data=None, modality="image", identifier="img", mm_position=position)
    return Request("r", [feature])


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("impl", ["vllm", "rust"])
def test_first_sight_of_a_masked_item(benchmark: Any, impl: str, length: int) -> None:
    manager = STEP_MANAGERS[impl](1 << 20)
    benchmark.group = f"mask of {length:>4} entries"

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        request = fresh_request(length)
        manager.free(request)  # forget the last round's request of the same id
        return (request, 0, length, BUDGET), {}

    result = benchmark.pedantic(manager.try_schedule_encoder_inputs, setup=setup, rounds=ROUNDS)
    embeds = length - length // 8
    assert result == ([0], length, BUDGET - embeds, [], [])
