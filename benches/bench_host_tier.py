"""The host tier's block cache per operation: vLLM 0.33.0's ``EmbeddingCache``
(``vllm``, see host_tier_baseline.py) against ``encoder_cache.HostBlockCache``
under each policy, on the operations vLLM's ``ECCPUConnector`` makes.

The pool is 2**20 blocks (8 GiB of host memory for a model whose embedding
row is 8 KiB: hidden size 4096 in bfloat16, one block per row); an item is
576 blocks (a 336-pixel LLaVA image). Each case leaves the cache as it found
it, or in a steady state (the eviction case turns its entries over).
"""

from __future__ import annotations

import itertools

import host_tier_baseline
import pytest
import vllm_baseline

from encoder_cache import HOST_POLICIES, HostBlockCache

NUM_BLOCKS = 1 << 20
ITEM_BLOCKS = 576
SHAPE = (ITEM_BLOCKS, 4096)
IMPLEMENTATIONS = ["vllm", *HOST_POLICIES]


def make_cache(impl: str, num_blocks: int = NUM_BLOCKS):
    if impl == "vllm":
        try:
            return host_tier_baseline.embedding_cache_class()(num_blocks)
        except vllm_baseline.Unavailable as exc:
            pytest.skip(f"vLLM baseline: {exc}")
    return HostBlockCache(num_blocks, policy=impl)


def fill(cache, count: int, prefix: str = "item") -> list[str]:
    """``count`` ready entries of ITEM_BLOCKS blocks; their keys."""
    keys = [f"{prefix}-{n:058d}" for n in range(count)]  # 64 characters, as a sha256 mm_hash
    for key in keys:
        assert cache.alloc(key, ITEM_BLOCKS, SHAPE) is not None
        cache.mark_ready(key)
    return keys


@pytest.fixture(params=IMPLEMENTATIONS)
def warm(request):
    """(implementation, cache) holding 64 ready entries, room for many more."""
    cache = make_cache(request.param)
    return request.param, cache, fill(cache, 64)


@pytest.mark.benchmark(group="host: get (has_cache_item)")
def bench_get(benchmark, warm):
    _, cache, keys = warm
    key = keys[17]
    ready = benchmark(lambda: cache.get(key).ready)
    assert ready is True


@pytest.mark.benchmark(group="host: pin + unpin (a load)")
def bench_pin_unpin(benchmark, warm):
    _, cache, keys = warm
    key = keys[17]

    def load():
        cache.pin(key)
        cache.unpin(key)

    benchmark(load)
    assert cache.get(key).evictable


@pytest.mark.benchmark(group="host: alloc evicting + mark_ready (a save)")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def bench_alloc_evict_ready(benchmark, impl):
    """A full pool of ready entries: each alloc evicts one entry (the policy's
    victim) to make room, then the new entry is marked ready (a save)."""
    cache = make_cache(impl, num_blocks=64 * ITEM_BLOCKS)
    fill(cache, 64)
    counter = itertools.count()

    def save():
        key = f"new-{next(counter):059d}"
        cache.alloc(key, ITEM_BLOCKS, SHAPE)
        cache.mark_ready(key)

    benchmark(save)
    assert len(cache._entries if impl == "vllm" else cache) == 64


@pytest.mark.benchmark(group="host: alloc + discard (no eviction)")
def bench_alloc_discard(benchmark, warm):
    _, cache, _ = warm

    def cycle():
        cache.alloc("fresh", ITEM_BLOCKS, SHAPE)
        cache.discard("fresh")

    benchmark(cycle)
    assert cache.get("fresh") is None
