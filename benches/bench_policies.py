"""Eviction policies: what each costs per call, on a full cache that evicts.

- churn: a long-lived manager whose cache holds about four requests' items;
  each round schedules a new 16-item request item by item (check for a hit,
  can_allocate, allocate) and frees it. Half of its items come from a small
  popular set (hits, or re-encodes once evicted), half are new, so every round
  evicts and the policy chooses. It is timed in its steady state: warm-up
  rounds first evict more items than any memory of evicted items holds (the
  re-encode counter's, ``lfu-ghost``'s and ``duel``'s counts, ARC's ghosts), so
  each is full and forgets one item per eviction, as on a server that has run
  for a while;
- lookahead: ``mark_waiting`` then ``unmark_waiting`` of a 16-item request
  whose items are cached and evictable (each moves tier twice);
- stats: one ``stats()`` call on that manager (a scheduler may call it every step).

Every policy runs on each implementation that takes ``policy=``: the
pure-Python twin always, the Rust manager once its bindings do.
"""

from __future__ import annotations

import itertools

import pytest
from workloads import BUDGET, mm_hash

import encoder_cache
from encoder_cache import reference
from encoder_cache.reference import EVICTED_MEMORY, POLICIES
from encoder_cache.reference.policies import ARC_GHOST_ITEMS, FREQUENCY_MEMORY
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request

ITEMS = 16
SIZE = 64
POPULAR = 24
#: Rounds before the churn is timed: each evicts the request's ITEMS // 2 new items.
STEADY_STATE = max(EVICTED_MEMORY, ARC_GHOST_ITEMS, FREQUENCY_MEMORY) // (ITEMS // 2) + 64


def _implementations() -> dict[str, type]:
    implementations: dict[str, type] = {"python": reference.EncoderCacheManager}
    try:
        encoder_cache.EncoderCacheManager(8, policy="gdsf")
    except TypeError:
        return implementations
    implementations["rust"] = encoder_cache.EncoderCacheManager
    return implementations


IMPLEMENTATIONS = _implementations()
CASES = [f"{impl}-{policy}" for impl in IMPLEMENTATIONS for policy in POLICIES]


def _manager(case: str):
    impl, policy = case.split("-", 1)
    return IMPLEMENTATIONS[impl](4 * ITEMS * SIZE, policy=policy)


class Churn:
    """A new request per round: half popular items (drawn in a fixed cycle), half new."""

    def __init__(self, case: str) -> None:
        self.manager = _manager(case)
        self.rounds = itertools.count()
        self.popular = itertools.cycle(range(POPULAR))

    def next_request(self) -> tuple[tuple[Request], dict]:
        self.manager.get_freed_mm_hashes()  # the scheduler drains evictions every step
        n = next(self.rounds)
        ids = [mm_hash(1_000_000 + next(self.popular)) if i % 2 else mm_hash(n * ITEMS + i) for i in range(ITEMS)]
        features = [MultiModalFeature(h, PlaceholderRange(i * (SIZE + 1), SIZE)) for i, h in enumerate(ids)]
        return (Request(f"req-{n}", features),), {}

    def run(self, request: Request) -> None:
        manager = self.manager
        for i in range(ITEMS):
            if not manager.check_and_update_cache(request, i):
                manager.can_allocate(request, i, BUDGET, 0)
                manager.allocate(request, i)
        manager.free(request)


@pytest.mark.benchmark(group="policies: 16-item request scheduled and freed on a full cache")
@pytest.mark.parametrize("case", CASES)
def test_churn(benchmark, case):
    churn = Churn(case)
    for _ in range(STEADY_STATE):  # every memory of evicted items full (also when timing is off)
        churn.run(*churn.next_request()[0])
    benchmark.pedantic(churn.run, setup=churn.next_request, rounds=200)
    stats = churn.manager.stats()
    assert stats["evictions"] > 0 and stats["hits"] > 0, "every policy evicts and hits here"
    churn.manager.check_invariants()


@pytest.mark.benchmark(group="policies: mark_waiting + unmark_waiting, 16 evictable items")
@pytest.mark.parametrize("case", CASES)
def test_lookahead(benchmark, case):
    churn = Churn(case)
    for _ in range(4):
        churn.run(*churn.next_request()[0])
    request = churn.next_request()[0][0]
    churn.run(request)  # cached and released: every mark moves an entry between tiers

    def mark_and_unmark() -> None:
        churn.manager.mark_waiting(request)
        churn.manager.unmark_waiting(request)

    benchmark(mark_and_unmark)
    churn.manager.check_invariants()


@pytest.mark.benchmark(group="policies: stats()")
@pytest.mark.parametrize("case", CASES)
def test_stats(benchmark, case):
    churn = Churn(case)
    for _ in range(8):
        churn.run(*churn.next_request()[0])
    stats = benchmark(churn.manager.stats)
    assert stats["misses"] > 0
