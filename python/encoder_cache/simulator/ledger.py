"""What happens to each item occurrence, counted the same way by every engine.

An occurrence is an item a request needs; it counts again when a preempted
request starts over. Each is served once per (re)start, by one of:

- the KV prefix cache: the item lies wholly inside the cached prefix a
  request skips on admission (never looked up, never encoded);
- the encoder: the step that first schedules its tokens encodes it;
- the encoder cache: that step finds it cached (or encoded in the same step
  for another request).

The engine tells the ledger what it scheduled; the ledger keeps the counters
(and tells an observer, the oracle's first pass, when each occurrence is
served).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.results import Counters
from encoder_cache.simulator.spec import RequestSpec

__all__ = ["Ledger"]


class Ledger:
    def __init__(self, counters: Counters, cost: EncoderCost, observer: Any = None) -> None:
        self.counters = counters
        self.cost = cost
        self.observer = observer
        self.encoded_ids: set[str] = set()
        self.seen_ids: set[str] = set()

    def arrived(self, spec: RequestSpec) -> None:
        c = self.counters
        for item in spec.items:
            if item.identifier not in self.seen_ids:
                self.seen_ids.add(item.identifier)
                c.distinct_items += 1
                c.distinct_embeds += item.length

    def admitted(self, spec: RequestSpec, served: list[bool], ends: list[int], computed: int) -> None:
        """The request skips ``computed`` cached tokens: items wholly inside are served by the prefix cache."""
        c, observer = self.counters, self.observer
        for i in range(bisect_right(ends, computed)):
            if not served[i]:
                served[i] = True
                c.prefix_skipped_items += 1
                c.prefix_skipped_embeds += spec.items[i].length
                if observer is not None:
                    observer.prefix_served(spec.request_id, i, spec.items[i].identifier)

    def scheduled(
        self,
        spec: RequestSpec,
        served: list[bool],
        starts: list[int],
        ends: list[int],
        computed: int,
        num_new: int,
        to_encode: list[int],
    ) -> tuple[int, int]:
        """Tokens ``computed .. computed + num_new`` are scheduled, encoding
        ``to_encode``; the rest of the items they overlap come from the cache.
        Returns the overlapped items' index range."""
        first = bisect_right(ends, computed)
        last = bisect_left(starts, computed + num_new)
        if first >= last and not to_encode:
            return first, last
        c, items, observer = self.counters, spec.items, self.observer
        step = c.steps
        for i in to_encode:
            item = items[i]
            embeds = item.length
            c.encoded_items += 1
            c.encoded_embeds += embeds
            c.encoder_seconds += self.cost.seconds(embeds)
            if item.identifier in self.encoded_ids:
                c.recomputed_items += 1
                c.recomputed_embeds += embeds
                if served[i]:
                    c.evicted_in_use_embeds += embeds
            else:
                self.encoded_ids.add(item.identifier)
            if not served[i] and observer is not None:
                observer.served(spec.request_id, i, item.identifier, step)
            served[i] = True
        for i in range(first, last):
            if not served[i]:
                served[i] = True
                c.cache_hits += 1
                c.hit_embeds += items[i].length
                if observer is not None:
                    observer.served(spec.request_id, i, items[i].identifier, step)
        return first, last

    def restarted(self, spec: RequestSpec, served: list[bool]) -> None:
        """A preempted request starts over: its occurrences are needed again."""
        if self.observer is not None:
            for i, item in enumerate(spec.items):
                if served[i]:
                    self.observer.needed_again(spec.request_id, i, item.identifier)
        served[:] = [False] * len(served)
