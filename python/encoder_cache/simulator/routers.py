"""The routing choices in front of several replicas: which replica gets a request.

Every router sees the replicas' loads (requests routed to each and not yet
finished, as a router counts them) and picks one replica per request:

- ``round-robin``: the next replica in turn;
- ``least-loaded``: the replica with the fewest requests;
- ``lru-guess``: llm-d's ``mm-embeddings-cache-producer`` as it works today:
  a router-side LRU of item hashes per replica, recorded when the router
  places a request there (nothing tells it what the replica evicted), sized
  at 4,096 MB per server at an assumed 2 MiB per entry (2,048 entries);
- ``cache-aware``: the exact encoder-cache events of every replica, applied to an
  ``encoder_cache.events.CacheIndex``, scored with its ``score(items)``;
- ``cache-aware+placed``: the same events, plus the items of the requests the
  router has placed on each replica and not yet seen stored there (until the
  request finishes): what the replica is about to encode, before any event
  can say so;
- ``cache-aware+kv``: the exact events of both caches, the encoder cache's
  and vLLM's KV-cache events (``kv_events.py``). A replica's score is the
  encoder work the request would be spared there (``spared_embeds``): the
  items whose placeholders lie inside the replica's cached KV prefix for the
  request are never encoded, and of the others those its encoder cache holds
  are not encoded either.

The cache routers share one selection rule, so that only their view of the
caches differs: among the replicas that are not overloaded (at most
``slack`` requests more than the least-loaded one), the one with the highest
score (the embeddings of the request's items it holds, or for
``cache-aware+kv`` the embeddings it would spare); ties go to the less
loaded, then to the next in turn. (llm-d adds weighted scores of its
scorers; a threshold keeps the comparison to the cache signal alone.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from typing import Any

from encoder_cache.events.index import CacheIndex
from encoder_cache.simulator.kv_events import KvBlockIndex, PromptHashes
from encoder_cache.simulator.spec import RequestSpec

__all__ = [
    "GUESS_ENTRIES",
    "ROUTINGS",
    "CacheAware",
    "CacheAwareKv",
    "CacheAwarePlaced",
    "LeastLoaded",
    "LruGuess",
    "RoundRobin",
    "Router",
    "make_router",
    "request_items",
    "spared_embeds",
]

ROUTINGS = ("round-robin", "least-loaded", "lru-guess", "cache-aware", "cache-aware+placed", "cache-aware+kv")
#: llm-d's default: 4,096 MB per server over an assumed 2 MiB per cached item.
GUESS_ENTRIES = 4096 // 2
#: A replica is overloaded with more than this many requests above the least-loaded one.
DEFAULT_SLACK = 8


def request_items(spec: RequestSpec) -> dict[str, int]:
    """The request's distinct items: identifier -> embeddings."""
    return {item.identifier: item.length for item in spec.items}


def spared_embeds(spec: RequestSpec, prefix_tokens: int, cached: Container[str]) -> int:
    """Embeddings of ``spec``'s distinct items a replica would not encode: those whose every
    occurrence ends inside its cached KV prefix of ``prefix_tokens`` tokens, and those in ``cached``
    (its encoder cache). An item the prefix covers only in part is encoded whole."""
    ends: dict[str, int] = {}
    embeds: dict[str, int] = {}
    for item in spec.items:
        ends[item.identifier] = max(ends.get(item.identifier, 0), item.offset + item.length)
        embeds[item.identifier] = item.length
    return sum(n for h, n in embeds.items() if ends[h] <= prefix_tokens or h in cached)


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

    def held(self, spec: RequestSpec, items: dict[str, int]) -> list[int]:
        """Each replica's score for ``spec`` (its distinct ``items``), in this router's view."""
        raise NotImplementedError

    def choose(self, spec: RequestSpec, loads: list[int]) -> int:
        order = self._rotation()
        items = request_items(spec)
        if not items:
            return min(order, key=lambda r: loads[r])
        scores = self.held(spec, items)
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

    def held(self, spec: RequestSpec, items: dict[str, int]) -> list[int]:
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

    def held(self, spec: RequestSpec, items: dict[str, int]) -> list[int]:
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

    def held(self, spec: RequestSpec, items: dict[str, int]) -> list[int]:
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


class CacheAwareKv(CacheAware):
    """Both caches' exact events: each replica scored by the embeddings it would spare the request."""

    name = "cache-aware+kv"

    def __init__(self, replicas: int, slack: int, index: CacheIndex, kv: KvBlockIndex, hashes: PromptHashes) -> None:
        super().__init__(replicas, slack, index)
        self.kv = kv
        self.hashes = hashes

    def held(self, spec: RequestSpec, items: dict[str, int]) -> list[int]:
        hashes = self.hashes.of(spec)
        return [
            spared_embeds(spec, self.kv.prefix_tokens(r, hashes), self.index.engine(r).items)
            for r in range(self.replicas)
        ]


def make_router(
    name: str,
    replicas: int,
    index: CacheIndex,
    *,
    kv: KvBlockIndex | None = None,
    hashes: PromptHashes | None = None,
    slack: int = DEFAULT_SLACK,
    **options: Any,
) -> Router:
    """The router called ``name`` (one of ``ROUTINGS``); ``index`` is the replicas' exact
    encoder-cache index, ``kv`` their KV block index and ``hashes`` the requests' block
    hashes (``cache-aware+kv`` needs both)."""
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
    if name == "cache-aware+kv":
        if kv is None or hashes is None:
            raise ValueError("cache-aware+kv needs the replicas' KV block index and the requests' block hashes")
        return CacheAwareKv(replicas, slack, index, kv, hashes)
    raise ValueError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
