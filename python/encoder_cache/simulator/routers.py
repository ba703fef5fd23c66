"""The routing choices in front of several replicas: which replica gets a request.

Every router sees the replicas' loads (requests routed to each and not yet
finished, as a router counts them) and picks one replica per request:

- ``round-robin``: the next replica in turn;
- ``least-loaded``: the replica with the fewest requests;
- ``lru-guess``: llm-d's ``mm-embeddings-cache-producer`` as it works today:
  a router-side LRU of item hashes per replica, recorded when the router
  places a request there (nothing tells it what the replica evicted), sized
  at 4,096 MB per server at an assumed 2 MiB per entry (2,048 entries);
- ``cache-aware``: the exact cache events of every replica, applied to an
  ``encoder_cache.events.CacheIndex``, scored with its ``score(items)``;
- ``cache-aware+placed``: the same events, plus the items of the requests the
  router has placed on each replica and not yet seen stored there (until the
  request finishes): what the replica is about to encode, before any event
  can say so.

The two cache routers share one selection rule, so that only their view of
the caches differs: among the replicas that are not overloaded (at most
``slack`` requests more than the least-loaded one), the one holding most of
the request's embeddings; ties go to the less loaded, then to the next in
turn. (llm-d adds weighted scores of its scorers; a threshold keeps the
comparison to the cache signal alone.)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from encoder_cache.events.index import CacheIndex
from encoder_cache.simulator.spec import RequestSpec

__all__ = [
    "GUESS_ENTRIES",
    "ROUTINGS",
    "CacheAware",
    "CacheAwarePlaced",
    "LeastLoaded",
    "LruGuess",
    "RoundRobin",
    "Router",
    "make_router",
    "request_items",
]

ROUTINGS = ("round-robin", "least-loaded", "lru-guess", "cache-aware", "cache-aware+placed")
#: llm-d's default: 4,096 MB per server over an assumed 2 MiB per cached item.
GUESS_ENTRIES = 4096 // 2
#: A replica is overloaded with more than this many requests above the least-loaded one.
DEFAULT_SLACK = 8


def request_items(spec: RequestSpec) -> dict[str, int]:
    """The request's distinct items: identifier -> embeddings."""
    return {item.identifier: item.length for item in spec.items}


class Router:
    """Picks a replica for each request; ``placed`` is told where it went."""

    name = ""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.turn = 0  # the replica that wins the next tie

    def choose(self, spec: RequestSpec, loads: list[int]) -> int:
        raise NotImplementedError

    def placed(self, spec: RequestSpec, replica: int) -> None:
        """The request went to ``replica`` (by this router or by its session)."""

    def finished(self, spec: RequestSpec, replica: int) -> None:
        """A request placed on ``replica`` finished."""

    def stored(self, replica: int, identifiers: list[str]) -> None:
        """``replica``'s events reported these items stored."""

    def believes(self, replica: int, identifier: str) -> bool | None:
        """Whether the router thinks ``replica`` holds the item (None: it has no view)."""
        return None

    def _rotation(self) -> list[int]:
        n = self.replicas
        order = [(self.turn + i) % n for i in range(n)]
        self.turn = (self.turn + 1) % n
        return order


class RoundRobin(Router):
    name = "round-robin"

    def choose(self, spec: RequestSpec, loads: list[int]) -> int:
        return self._rotation()[0]


class LeastLoaded(Router):
    name = "least-loaded"

    def choose(self, spec: RequestSpec, loads: list[int]) -> int:
        return min(self._rotation(), key=lambda r: loads[r])


class _Affinity(Router):
    """The cache routers' rule (see the module doc); ``held`` is their view."""

    def __init__(self, replicas: int, slack: int) -> None:
        super().__init__(replicas)
        self.slack = slack

    def held(self, items: dict[str, int]) -> list[int]:
        """Embeddings of ``items`` each replica holds, in this router's view."""
        raise NotImplementedError

    def choose(self, spec: RequestSpec, loads: list[int]) -> int:
        order = self._rotation()
        items = request_items(spec)
        if not items:
            return min(order, key=lambda r: loads[r])
        scores = self.held(items)
        least = min(loads)
        eligible = [r for r in order if loads[r] <= least + self.slack]
        return max(eligible, key=lambda r: (scores[r], -loads[r]))


class LruGuess(_Affinity):
    """A per-replica LRU of the item hashes placed there (llm-d's guess)."""

    name = "lru-guess"

    def __init__(self, replicas: int, slack: int, entries: int = GUESS_ENTRIES) -> None:
        super().__init__(replicas, slack)
        self.entries = entries
        self.lru: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(replicas)]

    def held(self, items: dict[str, int]) -> list[int]:
        # A lookup does not refresh an entry (llm-d uses Contains, not Get).
        return [sum(n for h, n in items.items() if h in lru) for lru in self.lru]

    def placed(self, spec: RequestSpec, replica: int) -> None:
        lru = self.lru[replica]
        for identifier in request_items(spec):
            lru[identifier] = None
            lru.move_to_end(identifier)
        while len(lru) > self.entries:
            lru.popitem(last=False)

    def believes(self, replica: int, identifier: str) -> bool:
        return identifier in self.lru[replica]


class CacheAware(_Affinity):
    """The replicas' exact cached items, from their cache events."""

    name = "cache-aware"

    def __init__(self, replicas: int, slack: int, index: CacheIndex) -> None:
        super().__init__(replicas, slack)
        self.index = index

    def held(self, items: dict[str, int]) -> list[int]:
        scores = self.index.score(items)
        return [scores.get(r, 0) for r in range(self.replicas)]

    def believes(self, replica: int, identifier: str) -> bool:
        return identifier in self.index.engine(replica).items


class CacheAwarePlaced(CacheAware):
    """The exact cached items, plus those of the requests placed on a replica
    that its events have not reported stored yet (and that have not finished)."""

    name = "cache-aware+placed"

    def __init__(self, replicas: int, slack: int, index: CacheIndex) -> None:
        super().__init__(replicas, slack, index)
        #: Per replica: identifier -> the unfinished placed requests waiting for it to be stored.
        self.in_flight: list[dict[str, set[str]]] = [{} for _ in range(replicas)]

    def held(self, items: dict[str, int]) -> list[int]:
        scores = []
        for r in range(self.replicas):
            cached, placed = self.index.engine(r).items, self.in_flight[r]
            scores.append(sum(n for h, n in items.items() if h in cached or h in placed))
        return scores

    def placed(self, spec: RequestSpec, replica: int) -> None:
        waiting = self.in_flight[replica]
        for identifier in request_items(spec):
            waiting.setdefault(identifier, set()).add(spec.request_id)

    def stored(self, replica: int, identifiers: list[str]) -> None:
        waiting = self.in_flight[replica]
        for identifier in identifiers:
            waiting.pop(identifier, None)  # the index knows it from now on

    def finished(self, spec: RequestSpec, replica: int) -> None:
        waiting = self.in_flight[replica]
        for identifier in request_items(spec):
            requests = waiting.get(identifier)
            if requests is not None:
                requests.discard(spec.request_id)
                if not requests:
                    del waiting[identifier]

    def believes(self, replica: int, identifier: str) -> bool:
        return super().believes(replica, identifier) or identifier in self.in_flight[replica]


def make_router(name: str, replicas: int, index: CacheIndex, *, slack: int = DEFAULT_SLACK, **options: Any) -> Router:
    """The router called ``name`` (one of ``ROUTINGS``); ``index`` is the replicas' exact cache index."""
    if name == "round-robin":
        return RoundRobin(replicas)
    if name == "least-loaded":
        return LeastLoaded(replicas)
    if name == "lru-guess":
        return LruGuess(replicas, slack, options.get("guess_entries", GUESS_ENTRIES))
    if name == "cache-aware":
        return CacheAware(replicas, slack, index)
    if name == "cache-aware+placed":
        return CacheAwarePlaced(replicas, slack, index)
    raise ValueError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
