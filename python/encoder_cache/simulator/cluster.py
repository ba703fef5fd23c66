"""Several replicas behind a router: each replica is the scheduler model
(``engine.py``) with its own manager, KV cache and prefix cache; the router
(``routers.py``) places every arriving request on one of them.

The workload's ``Arrivals`` is shared: a request arrives when it is due (a
session's turn after its previous turn finished, wherever that ran), the
router places it, and the replica reads it at that same step. All replicas
advance together, window by window: a window ends at the next arrival or at
the first step at which any replica could finish a request (a step decodes at
most one token per request), so a finish never releases a turn into a
window already run, and decode-only stretches inside a window are still
taken at once.

**Sessions stick** to the replica that served their first request, as real
routers do with session affinity (the replica holds the session's KV prefix);
``sticky=False`` routes every turn afresh.

**Cache events.** Every replica's manager is the one the vLLM hook runs with
events on (``observed_class`` with a publisher): at the end of each step its
``EventBatch`` (``take_event_batch()``) gives the step's events, applied at once
to one ``CacheIndex`` of all replicas (the reference consumer's index, as a
subscriber would after a sub-millisecond trip). The cache-aware routers score
with it; for the other routers it measures what was really cached where they
placed each request.

**KV-cache events.** Every replica's block pool is a ``kv_events.EventedPool``:
it queues vLLM's ``BlockStored`` and ``BlockRemoved`` events, and after each
window the cluster applies every replica's queue to one ``KvBlockIndex`` (at
a routing decision it holds what every earlier step published, as the
encoder-cache index does). ``cache-aware+kv`` scores with it and the
requests' block hashes (``PromptHashes``); for every router it measures what
the chosen replica would spare a request at placement.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from time import perf_counter
from typing import Any

from encoder_cache.events import wire
from encoder_cache.events.index import CacheIndex
from encoder_cache.observed import StepObservers, observed_class
from encoder_cache.simulator.arrivals import Arrivals
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.engine import steppable
from encoder_cache.simulator.kv_events import EventedPool, KvBlockIndex, PromptHashes
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.results import Counters, SimulationError
from encoder_cache.simulator.routers import Router, make_router, request_items, spared_embeds
from encoder_cache.simulator.spec import RequestSpec
from encoder_cache.simulator.variants import Variant, available_policies

__all__ = ["Cluster", "ReplicaResult", "RoutingResult", "evented_manager", "simulate_routing"]


@dataclass
class ReplicaResult:
    requests: int
    encoded_embeds: int
    #: Requests on the replica (routed, not finished), averaged over the run's steps.
    mean_load: float
    counters: dict[str, Any]


@dataclass
class RoutingResult:
    routing: str
    replicas: int
    encoder_cache_size: int
    sticky: bool
    #: The replicas' counters summed (distinct items counted once over all).
    counters: Counters
    per_replica: list[ReplicaResult]
    #: The step at which the last request finished, plus one.
    drain_steps: int
    #: Mean steps from a request's arrival to the end of its last step.
    mean_latency_steps: float
    #: Embeddings of the requests' items, over all placements.
    placed_embeds: int = 0
    #: Of those, the ones the chosen replica's cache held at placement (from its events).
    placed_cached_embeds: int = 0
    #: Of those, the ones the chosen replica would spare the request at placement, by its
    #: KV prefix or its encoder cache (``routers.spared_embeds``, from both caches' events).
    placed_spared_embeds: int = 0
    #: Embeddings the router believed the chosen replica held (routers with a view),
    #: and of those the ones it really held.
    believed_embeds: int = 0
    believed_true_embeds: int = 0
    #: Placements decided by a session's earlier turn.
    sticky_placements: int = 0
    wall_seconds: float = 0.0

    @property
    def load_imbalance(self) -> float:
        """The busiest replica's mean load over the replicas' mean (1.0: even)."""
        loads = [r.mean_load for r in self.per_replica]
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean > 0 else 1.0

    @property
    def guess_precision(self) -> float | None:
        return self.believed_true_embeds / self.believed_embeds if self.believed_embeds else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "routing": self.routing,
            "replicas": self.replicas,
            "encoder_cache_size": self.encoder_cache_size,
            "sticky_sessions": self.sticky,
            "encoded_embeds": self.counters.encoded_embeds,
            "recomputed_embeds": self.counters.recomputed_embeds,
            "load_imbalance": self.load_imbalance,
            "drain_steps": self.drain_steps,
            "mean_latency_steps": self.mean_latency_steps,
            "placed_embeds": self.placed_embeds,
            "placed_cached_embeds": self.placed_cached_embeds,
            "placed_spared_embeds": self.placed_spared_embeds,
            "believed_embeds": self.believed_embeds,
            "believed_true_embeds": self.believed_true_embeds,
            "sticky_placements": self.sticky_placements,
            "counters": self.counters.as_dict(),
            "per_replica": [
                {"requests": r.requests, "encoded_embeds": r.encoded_embeds, "mean_load": r.mean_load}
                for r in self.per_replica
            ],
            "wall_seconds": self.wall_seconds,
        }


class _IndexFeed:
    """A replica's event publisher that applies each step's batch to the router's index at once."""

    def __init__(self, index: CacheIndex, name: int) -> None:
        self.index = index
        self.name = name
        self.seq = -1

        self.router: Router | None = None

    def publish(self, record: Any) -> None:
        self.seq += 1
        events = record.events()
        self.index.apply_events(self.name, self.seq, events)
        if self.router is not None:
            self.router.stored(self.name, [e["hash"] for e in events if e["type"] == wire.STORED])

    def close(self) -> None:
        pass


def evented_manager(variant: Variant, cache_size: int, feed: Any) -> Any:
    """``variant``'s manager, publishing its cache events to ``feed`` (anything with ``publish(record)``)."""
    base = type(variant.manager(cache_size))
    cls = observed_class(base)
    if available_policies(variant.implementation) == ("vllm",):
        manager = cls(cache_size)
    else:
        manager = cls(cache_size, policy=variant.policy)
    manager.observers = StepObservers(publisher=feed)
    return manager


class _Inbox:
    """A replica's arrivals: what the router placed there, released at the window's start."""

    def __init__(self, cluster: Cluster, replica: int) -> None:
        self.cluster = cluster
        self.replica = replica
        self.pending: list[RequestSpec] = []
        self.horizon: int | None = None
        self.in_flight = 0  # the shared Arrivals keeps the count

    def due(self, clock: int) -> list[RequestSpec]:
        if not self.pending:
            return []
        out, self.pending = self.pending, []
        return out

    def next_event(self) -> int | None:
        return self.horizon

    def finished(self, spec: RequestSpec, clock: int) -> None:
        self.cluster.finished(self.replica, spec, clock)


class Cluster:
    """The replicas, their shared arrivals and the router; ``run()`` replays the
    workload once (``simulate_routing`` builds and runs one)."""

    def __init__(
        self,
        workload: Any,
        limits: SchedulerLimits,
        variant: Variant,
        replicas: int,
        routing: str,
        *,
        cache_size: int | None,
        cost: EncoderCost,
        sticky: bool,
        check: bool,
        router_options: dict[str, Any],
    ) -> None:
        budget, derived = limits.encoder_budget(workload.max_embeds_per_item())
        self.size = derived if cache_size is None else max(cache_size, *workload.max_embeds_per_item().values(), 1)
        self.workload = workload
        self.arrivals = Arrivals(iter(()))  # the workload's, from run()
        self.index = CacheIndex()
        feeds = [_IndexFeed(self.index, r) for r in range(replicas)]
        self.managers = [evented_manager(variant, self.size, feed) for feed in feeds]
        self.inboxes = [_Inbox(self, r) for r in range(replicas)]
        self.runs = [
            steppable(self.inboxes[r], limits, self.managers[r], budget, cost, lookahead=variant.lookahead, check=check)
            for r in range(replicas)
        ]
        for run in self.runs:
            run.pool = EventedPool.like(run.pool)  # before the first step: nothing allocated yet
        self.kv = KvBlockIndex(replicas)
        self.hashes = PromptHashes()
        self.router: Router = make_router(
            routing, replicas, self.index, kv=self.kv, hashes=self.hashes, **router_options
        )
        for feed in feeds:
            feed.router = self.router
        self.sticky = sticky
        self.sessions: dict[str, int] = {}
        self.loads = [0] * replicas
        self.load_steps = [0] * replicas
        self.routed = [0] * replicas
        self.arrived_at: dict[str, int] = {}
        self.latency_steps = 0
        self.finished_requests = 0
        self.last_finish = -1
        self.seen: set[str] = set()
        self.distinct = [0, 0]
        self.result = RoutingResult(routing, replicas, self.size, sticky, Counters(), [], 0, 0.0)

    def route(self, spec: RequestSpec, clock: int) -> None:
        result = self.result
        replica = self.sessions.get(spec.session) if (self.sticky and spec.session is not None) else None
        if replica is None:
            replica = self.router.choose(spec, self.loads)
            if self.sticky and spec.session is not None:
                self.sessions[spec.session] = replica
        else:
            result.sticky_placements += 1
        items = request_items(spec)
        held = self.index.engine(replica).items
        prefix = self.kv.prefix_tokens(replica, self.hashes.of(spec))  # every request, in arrival order
        result.placed_spared_embeds += spared_embeds(spec, prefix, held)
        for identifier, embeds in items.items():
            result.placed_embeds += embeds
            cached = identifier in held
            if cached:
                result.placed_cached_embeds += embeds
            if self.router.believes(replica, identifier):
                result.believed_embeds += embeds
                if cached:
                    result.believed_true_embeds += embeds
            if identifier not in self.seen:
                self.seen.add(identifier)
                self.distinct[0] += 1
                self.distinct[1] += embeds
        self.router.placed(spec, replica)
        self.inboxes[replica].pending.append(spec)
        self.loads[replica] += 1
        self.routed[replica] += 1
        self.arrived_at[spec.request_id] = clock

    def finished(self, replica: int, spec: RequestSpec, clock: int) -> None:
        self.loads[replica] -= 1
        self.router.finished(spec, replica)
        self.arrivals.finished(spec, clock)
        self.latency_steps += clock + 1 - self.arrived_at.pop(spec.request_id)
        self.finished_requests += 1
        self.last_finish = max(self.last_finish, clock)

    def _earliest_finish(self, clock: int) -> int | None:
        times = []
        for run, inbox in zip(self.runs, self.inboxes):
            when = run.earliest_finish()
            if when is not None:
                times.append(when)
            times.extend(clock + spec.output_tokens - 1 for spec in inbox.pending)
        return min(times) if times else None

    def run(self) -> RoutingResult:
        self.arrivals = Arrivals(iter(self.workload.requests()))
        clock = 0
        while True:
            for spec in self.arrivals.due(clock):
                self.route(spec, clock)
            arrival = self.arrivals.next_event()
            finish = self._earliest_finish(clock)
            if finish is None and arrival is None:
                if self.arrivals.in_flight:
                    raise SimulationError(
                        f"{self.arrivals.in_flight} requests wait for session turns that never finish"
                    )
                break
            horizon = min(t for t in (arrival, None if finish is None else finish + 1) if t is not None)
            horizon = max(horizon, clock + 1)
            for r, inbox in enumerate(self.inboxes):
                self.load_steps[r] += self.loads[r] * (horizon - clock)
                inbox.horizon = horizon
                self.runs[r].run(horizon)
            self._publish_kv_events()
            clock = horizon
        for inbox, run in zip(self.inboxes, self.runs):
            inbox.horizon = None
            run.run()  # the end of the run: its final checks
        self._publish_kv_events()
        return self._result(clock)

    def _publish_kv_events(self) -> None:
        for r, run in enumerate(self.runs):
            self.kv.apply(r, run.pool.take_events())

    def _result(self, clock: int) -> RoutingResult:
        result = self.result
        total = Counters()
        additive = [f.name for f in fields(Counters) if f.name not in ("distinct_items", "distinct_embeds")]
        steps = max(clock, 1)
        for r, run in enumerate(self.runs):
            counters = run.counters
            for name in additive:
                setattr(total, name, getattr(total, name) + getattr(counters, name))
            result.per_replica.append(
                ReplicaResult(self.routed[r], counters.encoded_embeds, self.load_steps[r] / steps, counters.as_dict())
            )
        total.distinct_items, total.distinct_embeds = self.distinct
        result.counters = total
        result.drain_steps = self.last_finish + 1
        result.mean_latency_steps = self.latency_steps / max(self.finished_requests, 1)
        return result


def simulate_routing(
    workload: Any,
    limits: SchedulerLimits,
    variant: Variant,
    replicas: int,
    routing: str,
    *,
    cache_size: int | None = None,
    cost: EncoderCost | None = None,
    sticky: bool = True,
    check: bool = False,
    **router_options: Any,
) -> RoutingResult:
    """Replay ``workload`` through ``replicas`` replicas behind the ``routing`` router
    (``routers.ROUTINGS``); each replica runs ``variant``'s manager at ``cache_size``
    (default: the size vLLM derives). ``router_options``: ``slack``, ``guess_entries``."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    cluster = Cluster(
        workload,
        limits,
        variant,
        replicas,
        routing,
        cache_size=cache_size,
        cost=cost or EncoderCost(),
        sticky=sticky,
        check=check,
        router_options=router_options,
    )
    start = perf_counter()
    result = cluster.run()
    result.wall_seconds = perf_counter() - start
    return result
