"""The offline ceiling: Belady's MIN for the encoder cache, in the simulator only.

``oracle`` evicts the evictable entry whose next use lies farthest ahead. The
future comes from a first pass over the same arrivals with the ``vllm``
policy at the same cache size: it records the step at which every
``(request, item)`` occurrence was looked up in the encoder cache (encoded,
or taken from the cache). Occurrences the KV prefix cache served are not
uses of the encoder cache: the first pass leaves them out, and the second
marks them served. The second pass, the one reported, knows
every occurrence still to be served and orders them by the first pass's
steps; an occurrence leaves the future as soon as the second pass serves it,
and a preempted request's items come back into it. An entry no pending
occurrence needs is evicted first.

The two passes schedule alike until their caches first differ; after that an
item may be served a few steps earlier or later than the first pass said, so
the order is approximate where occurrences of different items lie close
together. With variable sizes Belady's rule is not exactly optimal either
(evicting one large entry may save more than two small ones); the oracle is
therefore a strong reference, not a proven bound, and a real policy may come
within a hair of it or, rarely, pass it on a workload.
"""

from __future__ import annotations

import heapq
import math

__all__ = ["AVAILABLE", "Future", "OraclePolicy", "Recorder"]

try:
    from encoder_cache.reference import EvictionPolicy
except ImportError:  # a manager without pluggable policies
    AVAILABLE = False

    class EvictionPolicy:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.tiers: tuple[dict[str, None], dict[str, None]] = ({}, {})
else:
    AVAILABLE = True


class Recorder:
    """The first pass: when each (request, input) occurrence was first served."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, int], int] = {}
        self.identifiers: dict[tuple[str, int], str] = {}

    def served(self, request_id: str, input_id: int, identifier: str, step: int) -> None:
        key = (request_id, input_id)
        if key not in self.times:
            self.times[key] = step
            self.identifiers[key] = identifier

    def prefix_served(self, request_id: str, input_id: int, identifier: str) -> None:
        pass

    def needed_again(self, request_id: str, input_id: int, identifier: str) -> None:
        pass


class Future:
    """The second pass's view of what is still to come, per identifier."""

    def __init__(self, recorder: Recorder) -> None:
        self.times = recorder.times
        self.pending: dict[str, list[tuple[int, str, int]]] = {}
        self.done: set[tuple[str, int]] = set()
        for key, step in recorder.times.items():
            self.pending.setdefault(recorder.identifiers[key], []).append((step, *key))
        for heap in self.pending.values():
            heapq.heapify(heap)

    def served(self, request_id: str, input_id: int, identifier: str, step: int) -> None:
        self.done.add((request_id, input_id))

    def prefix_served(self, request_id: str, input_id: int, identifier: str) -> None:
        self.done.add((request_id, input_id))

    def needed_again(self, request_id: str, input_id: int, identifier: str) -> None:
        """A preempted request will need the occurrence again (if the first pass looked it up)."""
        key = (request_id, input_id)
        if key in self.done and key in self.times:
            self.done.discard(key)
            heapq.heappush(self.pending.setdefault(identifier, []), (self.times.get(key, 0), *key))

    def next_use(self, identifier: str) -> float:
        heap = self.pending.get(identifier)
        while heap:
            step, request_id, input_id = heap[0]
            if (request_id, input_id) not in self.done:
                return step
            heapq.heappop(heap)
        return math.inf


class OraclePolicy(EvictionPolicy):
    """Evict the entry of the tier whose next use is farthest ahead (ties: released earlier)."""

    name = "oracle"

    def __init__(self, future: Future) -> None:
        super().__init__()
        self.future = future

    def victim(self, tier: int) -> str:
        best, best_use = None, -1.0
        for identifier in self.tiers[tier]:
            use = self.future.next_use(identifier)
            if use > best_use:
                best, best_use = identifier, use
                if use == math.inf:
                    break
        assert best is not None
        return best
