"""Eviction policies for the pure-Python manager, and the interface a custom one implements.

``encoder_cache.reference.EncoderCacheManager(cache_size, policy=...)`` takes a
policy name from :data:`POLICIES` or an :class:`EvictionPolicy` instance. The
built-in policies here make exactly the decisions of the Rust core's
(``src/cache/policy.rs``): same victims, same order, same tie-breaks, same
float arithmetic.

The manager keeps vLLM's rules around any policy: only unreferenced entries are
evictable, eviction happens only when an allocation needs room, and evicted
identifiers go to the freed list. It also applies the lookahead tiers: an
evictable entry that a waiting request will need (``mark_waiting``) is in tier
1, every other evictable entry in tier 0, and the manager asks for a tier-1
victim only when tier 0 is empty. A policy orders the entries within a tier.

See docs/policies.md for each policy's source, behaviour and cost.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from encoder_cache.reference.frequency_memory import FREQUENCY_MEMORY, FrequencyMemory
from encoder_cache.reference.shadows import Shadows

__all__ = [
    "ARC_GHOST_ITEMS",
    "FREQUENCY_MEMORY",
    "GDSF_COST_SCALE",
    "POLICIES",
    "RECOMMENDED",
    "S3FIFO_MAX_CREDIT",
    "ArcPolicy",
    "DuelPolicy",
    "EvictionPolicy",
    "GdsfPolicy",
    "GhostLfuPolicy",
    "S3FifoPolicy",
    "VllmPolicy",
    "make_policy",
]

#: The built-in policies, by name; "vllm" is the default.
POLICIES = ("vllm", "gdsf", "s3fifo", "lfu-ghost", "arc", "duel")

#: The policy the name "auto" selects: the recommended one.
RECOMMENDED = "duel"

#: GDSF's encoder-cost model: encoding ``n`` embeddings costs ``n + n**2 / C``
#: (a linear term for the MLP and projection, a quadratic one for the vision
#: transformer's attention over the item's patches), so cost per embedding is
#: ``1 + n / C``.
GDSF_COST_SCALE = 8192.0

#: S3-FIFO: the most hits the main queue remembers for an entry (each one buys
#: the entry one more pass before eviction).
S3FIFO_MAX_CREDIT = 3

#: ``arc``: each ghost list remembers evicted items up to half the cache size
#: in embeddings, and at most this many items.
ARC_GHOST_ITEMS = 65536


class EvictionPolicy:
    """Chooses which evictable (unreferenced) entry the manager evicts next.

    The manager calls the hooks below; every identifier it passes is a cached
    entry's. Call order for one entry: ``admitted`` once (it is allocated,
    referenced), then any number of ``accessed`` (hits: a request acquires it),
    ``released`` (it became evictable, in a tier) and ``retained`` (it stopped
    being evictable: referenced again, or about to move to the other tier, in
    which case ``released`` follows with the new tier), and finally
    ``evicted`` (after ``victim`` chose it, or on ``reset``, which calls
    ``reset`` instead).

    Tiers: ``0`` holds the evictable entries no waiting request needs, ``1``
    those some waiting request needs; ``victim(1)`` is asked only when tier 0
    is empty, and ``victim(tier)`` is asked only when that tier is non-empty.

    The base class keeps the bookkeeping every policy needs and evicts in
    release order (vLLM's rule) within a tier, in O(1) per call: subclasses
    extend the hooks (calling ``super()``) and override ``victim``. Its
    attributes are for subclasses to read, never to change:

    - ``sizes``: identifier -> num_embeds of every cached entry;
    - ``frequency``: identifier -> acquisitions of every cached entry since it
      was allocated (the allocation and each hit);
    - ``tiers``: two dicts, tier -> {identifier: None} of its evictable
      entries in release order (oldest first).
    """

    #: Reported by ``manager.policy`` and in snapshots.
    name = "custom"

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.frequency: dict[str, int] = {}
        #: What evictions so far have raised the policy's clock to (GDSF's aging).
        self.clock = 0.0
        self.tiers: tuple[dict[str, None], dict[str, None]] = ({}, {})
        self._tier_of: dict[str, int] = {}

    def reset(self) -> None:
        """Forget every entry (the manager was reset)."""
        self.sizes.clear()
        self.frequency.clear()
        self.clock = 0.0
        self._tier_of.clear()
        for tier in self.tiers:
            tier.clear()

    def sized(self, cache_size: int) -> None:
        """The cache now holds ``cache_size`` embeddings (built, reset or resized)."""

    def admitted(self, identifier: str, num_embeds: int) -> None:
        """``identifier`` was allocated (a miss): cached now, and referenced."""
        self.sizes[identifier] = num_embeds
        self.frequency[identifier] = 1

    def restored(self, identifier: str, num_embeds: int, frequency: int) -> None:
        """``restore`` brings back a cached entry acquired ``frequency`` times."""
        self.sizes[identifier] = num_embeds
        self.frequency[identifier] = frequency

    def accessed(self, identifier: str) -> None:
        """A request acquired cached ``identifier`` (a hit). If the entry was
        evictable, ``retained`` came first."""
        self.frequency[identifier] += 1

    def released(self, identifier: str, tier: int) -> None:
        """``identifier`` became evictable in ``tier`` (0 or 1)."""
        self._tier_of[identifier] = tier
        self.tiers[tier][identifier] = None

    def retained(self, identifier: str) -> None:
        """Evictable ``identifier`` is referenced again, or changes tier."""
        del self.tiers[self._tier_of.pop(identifier)][identifier]

    def victim(self, tier: int) -> str:
        """The evictable entry of ``tier`` to evict next (the tier is not empty).
        The manager evicts it at once (``evicted`` follows), so a policy may
        update its own order while choosing."""
        return next(iter(self.tiers[tier]))

    def evicted(self, identifier: str) -> None:
        """The evictable ``identifier`` left the cache."""
        tier = self._tier_of.pop(identifier)
        del self.tiers[tier][identifier]
        del self.sizes[identifier]
        del self.frequency[identifier]

    # Snapshots: what restore needs to rebuild the policy's state.

    def order(self, tier: int) -> list[str]:
        """The tier's evictable entries in the policy's canonical order (the
        order ``snapshot()`` lists them in and ``restore`` releases them in)."""
        return list(self.tiers[tier])

    def rank(self, identifier: str) -> float:
        """The per-entry number a snapshot keeps besides the frequency (GDSF:
        the priority of an evictable entry; S3-FIFO: its hit credit)."""
        return 0.0

    def restore_released(self, identifier: str, tier: int, rank: float) -> None:
        """``released`` as ``restore`` replays it, with the rank the snapshot kept."""
        self.released(identifier, tier)


class VllmPolicy(EvictionPolicy):
    """vLLM 0.33's rule: evict the entry released longest ago."""

    name = "vllm"


class GdsfPolicy(EvictionPolicy):
    """GreedyDual-Size-Frequency with aging (Cherkasova 1998).

    priority = clock + frequency * cost / size, fixed when the entry becomes
    evictable; the lowest priority is evicted (ties: released earlier first)
    and the clock rises to its priority, so entries that have waited long lose
    to newly released ones (a tier-1 victim can have a lower priority than
    the clock: the clock never goes down). Frequency counts the entry's acquisitions since it
    was allocated (the allocation and every hit). A heap with lazy deletion:
    O(log n) per call.
    """

    name = "gdsf"

    def __init__(self, cost_scale: float = GDSF_COST_SCALE) -> None:
        super().__init__()
        self.cost_scale = cost_scale
        #: identifier -> (priority, stamp) while evictable.
        self.priority: dict[str, tuple[float, int]] = {}
        self._heaps: tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]] = ([], [])
        self._stamp = 0

    def reset(self) -> None:
        super().reset()
        self.priority.clear()
        for heap in self._heaps:
            heap.clear()
        self._stamp = 0

    def released(self, identifier: str, tier: int) -> None:
        self.release_at(identifier, tier, self.clock + self.frequency[identifier] * self.value(identifier))

    def value(self, identifier: str) -> float:
        """cost / size for the entry: ``1 + n / C``."""
        return 1.0 + self.sizes[identifier] / self.cost_scale

    def release_at(self, identifier: str, tier: int, priority: float) -> None:
        super().released(identifier, tier)
        self._stamp += 1
        self.priority[identifier] = (priority, self._stamp)
        heapq.heappush(self._heaps[tier], (priority, self._stamp, identifier))

    def retained(self, identifier: str) -> None:
        super().retained(identifier)
        del self.priority[identifier]

    def victim(self, tier: int) -> str:
        heap = self._heaps[tier]
        while True:
            priority, stamp, identifier = heap[0]
            if self.priority.get(identifier) == (priority, stamp) and identifier in self.tiers[tier]:
                return identifier
            heapq.heappop(heap)  # stale: retained or moved since

    def evicted(self, identifier: str) -> None:
        super().evicted(identifier)
        self.clock = max(self.clock, self.priority.pop(identifier)[0])

    def order(self, tier: int) -> list[str]:
        return sorted(self.tiers[tier], key=self.priority.__getitem__)

    def rank(self, identifier: str) -> float:
        return self.priority[identifier][0] if identifier in self.priority else 0.0

    def restore_released(self, identifier: str, tier: int, rank: float) -> None:
        self.release_at(identifier, tier, rank)


class S3FifoPolicy(EvictionPolicy):
    """Scan-resistant, after S3-FIFO (Yang et al., SOSP 2023).

    Per tier, two FIFO queues of evictable entries in release order: *small*
    for entries acquired once since allocation (one-hit wonders: a scan, a
    video frame, an image nobody sends again) and *main* for entries hit at
    least once. Small is evicted first; when it is empty, main is a CLOCK: its
    oldest entry is evicted if it has no hit credit left, otherwise it spends
    one credit (credits: hits, at most :data:`S3FIFO_MAX_CREDIT`) and goes to
    the back. O(1) amortised: every pass is paid by an earlier hit.
    """

    name = "s3fifo"

    def __init__(self) -> None:
        super().__init__()
        #: identifier -> hit credit, for entries in a main queue.
        self.credit: dict[str, int] = {}
        self._small: tuple[OrderedDict[str, None], OrderedDict[str, None]] = (OrderedDict(), OrderedDict())
        self._main: tuple[OrderedDict[str, None], OrderedDict[str, None]] = (OrderedDict(), OrderedDict())

    def reset(self) -> None:
        super().reset()
        self.credit.clear()
        for queue in (*self._small, *self._main):
            queue.clear()

    def released(self, identifier: str, tier: int) -> None:
        super().released(identifier, tier)
        hits = self.frequency[identifier] - 1
        if hits:
            self.credit[identifier] = min(hits, S3FIFO_MAX_CREDIT)
            self._main[tier][identifier] = None
        else:
            self._small[tier][identifier] = None

    def retained(self, identifier: str) -> None:
        tier = self._tier_of[identifier]
        super().retained(identifier)
        self._small[tier].pop(identifier, None)
        if self._main[tier].pop(identifier, 0) is None:
            del self.credit[identifier]

    def victim(self, tier: int) -> str:
        small, main = self._small[tier], self._main[tier]
        if small:
            return next(iter(small))
        while True:
            identifier = next(iter(main))
            if not self.credit[identifier]:
                return identifier
            self.credit[identifier] -= 1
            main.move_to_end(identifier)

    def evicted(self, identifier: str) -> None:
        tier = self._tier_of[identifier]
        super().evicted(identifier)
        self._small[tier].pop(identifier, None)
        if self._main[tier].pop(identifier, 0) is None:
            del self.credit[identifier]

    def order(self, tier: int) -> list[str]:
        return [*self._small[tier], *self._main[tier]]

    def rank(self, identifier: str) -> float:
        return float(self.credit.get(identifier, 0))

    def restore_released(self, identifier: str, tier: int, rank: float) -> None:
        self.released(identifier, tier)
        if identifier in self.credit:
            self.credit[identifier] = int(rank)


class GhostLfuPolicy(GdsfPolicy):
    """Least frequently used, weighted by cost per size, whose frequency
    survives eviction.

    :class:`GdsfPolicy`'s heap and tie-breaks with priority ``frequency * cost
    / size`` and no aging (the clock stays 0), and a memory of the counts of
    the last items evicted (:class:`~encoder_cache.reference.frequency_memory.FrequencyMemory`,
    at least :data:`FREQUENCY_MEMORY` of them, more in a large cache): an item allocated again
    resumes the count it had when evicted (plus this allocation), so a popular
    item pushed out by a burst of one-off items comes back ranked above them.
    O(log n) per call, as GDSF; the memory adds O(1).
    """

    name = "lfu-ghost"

    def __init__(self, cost_scale: float = GDSF_COST_SCALE) -> None:
        super().__init__(cost_scale)
        self.memory = FrequencyMemory()

    def reset(self) -> None:
        super().reset()
        self.memory.clear()

    def sized(self, cache_size: int) -> None:
        self.memory.sized(cache_size)

    def admitted(self, identifier: str, num_embeds: int) -> None:
        super().admitted(identifier, num_embeds)
        self.frequency[identifier] = self.memory.take(identifier) + 1

    def released(self, identifier: str, tier: int) -> None:
        self.release_at(identifier, tier, self.frequency[identifier] * self.value(identifier))

    def evicted(self, identifier: str) -> None:
        count = self.frequency[identifier]
        super().evicted(identifier)
        self.clock = 0.0
        self.memory.insert(identifier, count)


class ArcPolicy(EvictionPolicy):
    """The Adaptive Replacement Cache (Megiddo and Modha, FAST 2003), over embeddings.

    An entry is *recent* (frequency 1: acquired once since allocation) or
    *frequent* (hit since allocation, or allocated again from a ghost list,
    which counts one more). Per tier, two queues of evictable entries in
    release order, one per class. While recent entries (referenced or not)
    hold more embeddings than the target ``p``, the oldest recent entry is
    the victim, else the oldest frequent one (each class standing in when
    the other has nothing evictable). Evicted items go to the ghost list of
    their class, each bounded to half the cache size in embeddings and
    :data:`ARC_GHOST_ITEMS` items, oldest forgotten first. Allocating an item
    of the recent ghosts raises ``p`` by its size times
    ``max(1, frequent ghost embeds // recent ghost embeds)``, one of the
    frequent ghosts lowers it the mirrored way; ``p`` starts at half the
    cache size, stays within it, and scales with a resize. Whole numbers
    throughout, as in the Rust core (``src/cache/arc.rs``). O(1) per call.
    """

    name = "arc"

    def __init__(self) -> None:
        self.cache_size = 0
        self.target = 0
        super().__init__()
        #: Embeddings of the cached recent entries, referenced or not.
        self.recent_embeds = 0
        #: Per class (0 recent, 1 frequent): identifier -> embeddings, oldest eviction first.
        self.ghosts: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self.ghost_embeds = [0, 0]
        self._lanes: tuple[tuple[dict[str, None], dict[str, None]], ...] = (({}, {}), ({}, {}))

    @property
    def clock(self) -> float:  # type: ignore[override]
        """The target ``p``, which a snapshot keeps as the clock."""
        return float(self.target)

    @clock.setter
    def clock(self, value: float) -> None:
        self.target = int(value)

    def reset(self) -> None:
        super().reset()
        self.cache_size = 0
        self.recent_embeds = 0
        for ghosts in self.ghosts:
            ghosts.clear()
        self.ghost_embeds = [0, 0]
        for lanes in self._lanes:
            for lane in lanes:
                lane.clear()

    def sized(self, cache_size: int) -> None:
        self.target = cache_size // 2 if self.cache_size == 0 else self.target * cache_size // self.cache_size
        self.cache_size = cache_size

    def _class(self, identifier: str) -> int:
        return int(self.frequency[identifier] > 1)

    def admitted(self, identifier: str, num_embeds: int) -> None:
        super().admitted(identifier, num_embeds)
        for kind in (0, 1):
            size = self.ghosts[kind].pop(identifier, None)
            if size is None:
                continue
            self.ghost_embeds[kind] -= size
            ratio = max(1, self.ghost_embeds[1 - kind] // max(self.ghost_embeds[kind], 1))
            if kind == 0:
                self.target = min(self.cache_size, self.target + num_embeds * ratio)
            else:
                self.target = max(0, self.target - num_embeds * ratio)
            self.frequency[identifier] = 2
            return
        self.recent_embeds += num_embeds

    def restored(self, identifier: str, num_embeds: int, frequency: int) -> None:
        super().restored(identifier, num_embeds, frequency)
        if frequency == 1:
            self.recent_embeds += num_embeds

    def accessed(self, identifier: str) -> None:
        if self.frequency[identifier] == 1:
            self.recent_embeds -= self.sizes[identifier]
        super().accessed(identifier)

    def released(self, identifier: str, tier: int) -> None:
        super().released(identifier, tier)
        self._lanes[tier][self._class(identifier)][identifier] = None

    def retained(self, identifier: str) -> None:
        tier = self._tier_of[identifier]
        super().retained(identifier)
        del self._lanes[tier][self._class(identifier)][identifier]

    def victim(self, tier: int) -> str:
        recent, frequent = self._lanes[tier]
        if recent and (self.recent_embeds > self.target or not frequent):
            return next(iter(recent))
        return next(iter(frequent))

    def evicted(self, identifier: str) -> None:
        tier, kind, size = self._tier_of[identifier], self._class(identifier), self.sizes[identifier]
        super().evicted(identifier)
        del self._lanes[tier][kind][identifier]
        if kind == 0:
            self.recent_embeds -= size
        ghosts = self.ghosts[kind]
        ghosts[identifier] = size
        self.ghost_embeds[kind] += size
        while self.ghost_embeds[kind] > self.cache_size // 2 or len(ghosts) > ARC_GHOST_ITEMS:
            oldest = next(iter(ghosts))
            self.ghost_embeds[kind] -= ghosts.pop(oldest)

    def order(self, tier: int) -> list[str]:
        return [*self._lanes[tier][0], *self._lanes[tier][1]]


class DuelPolicy(GhostLfuPolicy):
    """``lfu-ghost``'s order or vLLM's, whichever would have encoded fewer
    embeddings lately, as two shadow caches of the same size, fed every
    acquisition, measure it (:mod:`encoder_cache.reference.shadows`).

    :class:`GhostLfuPolicy`'s heap, priorities and frequency memory, and the
    base class's release order: the victim is the LFU heap's lowest while
    the LFU shadow encoded less lately by more than a near tie
    (:data:`~encoder_cache.reference.shadows.SHADOW_NEAR_TIE`), else the
    oldest release (near ties go to vLLM's order). A snapshot lists the evictable entries in
    release order with their priorities. O(log n) per call.
    """

    name = "duel"

    def __init__(self, cost_scale: float = GDSF_COST_SCALE) -> None:
        super().__init__(cost_scale)
        self.shadows = Shadows(0, cost_scale)

    def reset(self) -> None:
        super().reset()
        self.shadows = Shadows(self.shadows.capacity, self.cost_scale)

    def sized(self, cache_size: int) -> None:
        super().sized(cache_size)
        self.shadows.resize(cache_size)

    def admitted(self, identifier: str, num_embeds: int) -> None:
        super().admitted(identifier, num_embeds)
        self.shadows.acquire(identifier, num_embeds, self.frequency[identifier])

    def accessed(self, identifier: str) -> None:
        super().accessed(identifier)
        self.shadows.acquire(identifier, self.sizes[identifier], self.frequency[identifier])

    def victim(self, tier: int) -> str:
        if self.shadows.lfu_leads():
            return super().victim(tier)
        return next(iter(self.tiers[tier]))

    def order(self, tier: int) -> list[str]:
        return list(self.tiers[tier])


_BUILT_IN: dict[str, type[EvictionPolicy]] = {
    "vllm": VllmPolicy,
    "gdsf": GdsfPolicy,
    "s3fifo": S3FifoPolicy,
    "lfu-ghost": GhostLfuPolicy,
    "arc": ArcPolicy,
    "duel": DuelPolicy,
}


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """A fresh built-in policy by name, or ``policy`` itself if it is an object."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a name or an EvictionPolicy, not {type(policy).__name__}")
    try:
        return _BUILT_IN[RECOMMENDED if policy == "auto" else policy]()
    except KeyError:
        raise ValueError(f'policy must be one of {", ".join(POLICIES)} or auto, got "{policy}"') from None
