"""Two shadow caches for the ``duel`` policy: item identifiers and sizes
only, fed every acquisition the real cache sees, one evicting by vLLM's rule
(least recently used), one by ``lfu-ghost``'s (least frequently used,
weighted by cost per size, ranked by the count the real cache's
``lfu-ghost`` bookkeeping gives the item at its latest acquisition). Each
counts the embeddings it would have encoded; both counts are halved every
:data:`SHADOW_HALF_LIFE` acquisitions. The same caches as the Rust core's
(``src/cache/shadows.rs``), deciding the same.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

__all__ = ["SHADOW_HALF_LIFE", "SHADOW_NEAR_TIE", "Shadows"]

#: Acquisitions after which both shadows' counts of encoded embeddings are halved.
SHADOW_HALF_LIFE = 4096

#: The LFU shadow leads only once it encoded less by more than
#: ``1 / SHADOW_NEAR_TIE`` of its own count (integer division); closer counts
#: are a tie, which goes to vLLM's order.
SHADOW_NEAR_TIE = 256


class _ShadowLru:
    def __init__(self) -> None:
        self.items: OrderedDict[str, int] = OrderedDict()
        self.used = 0

    def acquire(self, identifier: str, num_embeds: int, capacity: int) -> int:
        if identifier in self.items:
            self.items.move_to_end(identifier)
            return 0
        self.items[identifier] = num_embeds
        self.used += num_embeds
        while self.used > capacity and len(self.items) > 1:
            self.used -= self.items.popitem(last=False)[1]
        return num_embeds


class _ShadowLfu:
    def __init__(self, cost_scale: float) -> None:
        self.cost_scale = cost_scale
        #: identifier -> [count, num_embeds, sequence of its live heap place]
        self.items: dict[str, list[int]] = {}
        self.heap: list[tuple[float, int, str]] = []
        self.used = 0
        self.sequence = 0

    def _place(self, identifier: str, item: list[int]) -> None:
        self.sequence += 1
        item[2] = self.sequence
        priority = item[0] * (1.0 + item[1] / self.cost_scale)
        heapq.heappush(self.heap, (priority, self.sequence, identifier))

    def acquire(self, identifier: str, num_embeds: int, count: int, capacity: int) -> int:
        item = self.items.get(identifier)
        if item is not None:
            item[0] = count
            self._place(identifier, item)
            if len(self.heap) > 2 * len(self.items) + 64:
                self.heap = [p for p in self.heap if self.items.get(p[2], (0, 0, -1))[2] == p[1]]
                heapq.heapify(self.heap)
            return 0
        self.used += num_embeds
        while self.used > capacity and self.items:
            _, sequence, victim = heapq.heappop(self.heap)
            held = self.items.get(victim)
            if held is not None and held[2] == sequence:
                del self.items[victim]
                self.used -= held[1]
        item = [count, num_embeds, 0]
        self._place(identifier, item)
        self.items[identifier] = item
        return num_embeds


class Shadows:
    """The two shadow caches and what each would have encoded lately. The
    LFU one ranks as ``lfu-ghost`` does: ``count * (1 + n / cost_scale)``,
    by the count it is given with each acquisition."""

    def __init__(self, capacity: int, cost_scale: float) -> None:
        self._lru = _ShadowLru()
        self._lfu = _ShadowLfu(cost_scale)
        self.resize(capacity)
        #: Embeddings each would have encoded lately: [LRU, LFU].
        self.encoded = [0, 0]
        self._acquisitions = 0

    def resize(self, capacity: int) -> None:
        """Both shadows now hold up to ``capacity`` embeddings (from their next miss on)."""
        self.capacity = capacity

    def acquire(self, identifier: str, num_embeds: int, count: int) -> None:
        """``identifier`` of ``num_embeds`` was acquired (a hit or an allocation),
        and ``lfu-ghost`` now counts it ``count`` times."""
        self.encoded[0] += self._lru.acquire(identifier, num_embeds, self.capacity)
        self.encoded[1] += self._lfu.acquire(identifier, num_embeds, count, self.capacity)
        self._acquisitions += 1
        if self._acquisitions == SHADOW_HALF_LIFE:
            self._acquisitions = 0
            self.encoded = [encoded // 2 for encoded in self.encoded]

    def lfu_leads(self) -> bool:
        """Whether the LFU shadow encoded less lately, by more than a near tie."""
        lru, lfu = self.encoded
        return lfu + lfu // SHADOW_NEAR_TIE < lru
