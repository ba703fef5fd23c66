"""The simulated KV prefix cache: block pool order, hash identity, and what it
saves the encoder in a two-turn chat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from encoder_cache.simulator import SchedulerLimits, Variant, simulate
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher, BlockPool
from encoder_cache.simulator.workloads import Item, RequestSpec, Workload


class _Config:
    def max_embeds_per_item(self):
        return {"image": 1000}

    def describe(self):
        return "two-turn chat"


# turn 0: 10 text tokens, image A (500 embeddings) wrapped in start/end tokens, 20 text tokens; 8 output tokens.
A = Item("A", 11, 500, "image")
TURN0 = RequestSpec("turn0", 0, "s", None, 532, 8, (A,))
# Between the turns, another user's request with a larger image X evicts A from a 1,000-embedding encoder cache.
FILLER = RequestSpec("filler", 20, None, None, 1012, 4, (Item("X", 1, 1000, "image"),))
# turn 1 re-sends turn 0's prompt and answer (540 tokens), then 30 new text tokens.
TURN1 = RequestSpec("turn1", 1, "s", 100, 570, 4, (A,))
CHAT = Workload(_Config(), (TURN0, TURN1, FILLER))
LIMITS = SchedulerLimits(max_num_batched_tokens=2048, encoder_cache_size=1000)


def test_turn_order_is_as_designed():
    result = simulate(CHAT, LIMITS, check=True)
    assert result.counters.requests == 3
    assert result.encoder_cache_size == 1000


def test_second_turn_encodes_nothing_while_its_prefix_is_cached():
    c = simulate(CHAT, LIMITS, check=True).counters
    assert c.encoded_embeds == 500 + 1000, "A once, X once: turn 1 takes A from the cached prefix"
    assert c.prefix_skipped_items == 1 and c.prefix_skipped_embeds == 500
    assert c.prefix_hit_tokens == 33 * BLOCK_SIZE, "turn 0 computed 539 tokens: 33 full blocks"
    assert 0 < c.prefix_hit_rate < 1


def test_second_turn_encodes_again_once_the_prefix_is_evicted():
    # 64 usable blocks (65 less the null block): the filler needs all of them, so turn 0's freed blocks are reused and lose their keys.
    c = simulate(CHAT, replace(LIMITS, kv_capacity=65 * BLOCK_SIZE), check=True).counters
    assert c.prefix_hit_tokens == 0
    assert c.encoded_embeds == 500 + 1000 + 500, "A is in neither cache any more: encoded again"
    assert c.recomputed_embeds == 500


def test_without_prefix_caching_the_encoder_cache_alone_decides():
    c = simulate(CHAT, replace(LIMITS, prefix_caching=False), check=True).counters
    assert c.prefix_query_tokens == c.prefix_hit_tokens == 0, "nothing is looked up"
    assert c.encoded_embeds == 2000
    big = simulate(CHAT, replace(LIMITS, prefix_caching=False), cache_size=4000, check=True).counters
    assert big.encoded_embeds == 1500 and big.cache_hits == 1, "a big enough encoder cache keeps A instead"


@pytest.mark.parametrize("lookahead", [False, True])
def test_prefix_results_hold_under_every_policy(lookahead):
    from encoder_cache.simulator import available_policies

    for policy in available_policies("python"):
        c = simulate(CHAT, LIMITS, Variant(policy, lookahead, "python"), check=True).counters
        assert c.encoded_embeds == 1500, policy


# The block pool


def test_freed_blocks_are_reused_least_recently_freed_first_tail_first():
    pool = BlockPool(7, caching=True)
    first = pool.allocate(3)
    second = pool.allocate(3)
    for block, h in zip(first + second, range(100, 106)):
        pool.cache(block, h)
    pool.release(first)  # tail first: first[2], first[1], first[0]
    pool.release(second)
    assert list(pool.free) == [first[2], first[1], first[0], second[2], second[1], second[0]]
    assert pool.longest_prefix([100, 101, 102]) == first
    (reused,) = pool.allocate(1)
    assert reused == first[2]
    assert pool.longest_prefix([100, 101, 102]) == first[:2], "the reused block lost its key"


def test_blocks_without_a_hash_are_reused_before_cached_ones():
    pool = BlockPool(7, caching=True)
    first = pool.allocate(3)
    second = pool.allocate(3)
    for block, h in zip(second, range(200, 203)):
        pool.cache(block, h)
    pool.cache(first[0], 100)
    pool.cache(first[1], 101)  # first[2] is a partial last block: no hash
    pool.release(second)
    pool.release(first)
    assert list(pool.free) == [first[2], second[2], second[1], second[0], first[1], first[0]], (
        "the unhashed block goes to the front; cached ones queue behind the older cached blocks"
    )
    without = BlockPool(4, caching=False)
    blocks = without.allocate(3)
    without.release(blocks)
    assert list(without.free) == [blocks[2], blocks[1], blocks[0]], "no caching: every block is reused first"


def test_the_null_block_is_never_handed_out():
    pool = BlockPool(3, caching=True)
    assert pool.num_usable == pool.num_free == 2
    blocks = pool.allocate(2)
    assert 0 not in blocks and pool.num_free == 0
    pool.release(blocks)
    assert 0 not in pool.free


def test_two_blocks_may_carry_one_hash_and_the_first_keyed_is_found():
    pool = BlockPool(4, caching=True)
    a, b = pool.allocate(2)
    pool.cache(a, 7)
    pool.cache(b, 7)  # another request computed the same block before a was found
    assert pool.longest_prefix([7]) == [a]
    pool.release([a])
    pool.release([b])
    pool.allocate(2)  # the free block, then a: a forgets its hash
    assert pool.longest_prefix([7]) == [b]


def test_touching_a_cached_free_block_takes_it_off_the_free_list():
    pool = BlockPool(3, caching=True)
    (block,) = pool.allocate(1)
    pool.cache(block, 7)
    pool.release([block])
    assert pool.num_free == 2
    hit = pool.longest_prefix([7])
    assert pool.num_evictable(hit) == 1
    pool.touch(hit)
    assert pool.num_free == 1 and pool.refs[block] == 1
    pool.touch(hit)  # a second request shares it
    pool.release([block])
    assert pool.num_free == 1, "still held by the other request"


def test_without_caching_nothing_is_found():
    pool = BlockPool(3, caching=False)
    (block,) = pool.allocate(1)
    pool.cache(block, 7)
    assert pool.longest_prefix([7]) == []


def test_block_hashes_chain_over_the_prefix_and_items():
    items = (Item("img", 20, 40, "image"),)
    a = BlockHasher([(0, 100, "r1", 0)], items, BLOCK_SIZE).upto(6)
    same = BlockHasher([(0, 100, "r1", 0)], items, BLOCK_SIZE).upto(6)
    assert a == same and len(set(a)) == 6
    other_image = BlockHasher([(0, 100, "r1", 0)], (Item("pic", 20, 40, "image"),), BLOCK_SIZE).upto(6)
    assert other_image[0] == a[0], "block 0 (tokens 0-15) holds no placeholder"
    assert other_image[1] != a[1], "block 1 holds the image's placeholders: its identifier counts"
    assert other_image[5] != a[5], "every later block differs through the chain"
    inherited = BlockHasher([(0, 64, "r1", 0), (64, 100, "r2", 64)], items, BLOCK_SIZE).upto(6)
    assert inherited[:4] == a[:4] and inherited[4] != a[4]
