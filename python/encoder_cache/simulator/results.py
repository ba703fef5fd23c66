"""What one run of a workload reports, whichever engine ran it: the counters,
the run's result, and the error a stalled or inconsistent run raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from encoder_cache.simulator.host_tier import HostTierCounters
from encoder_cache.simulator.variants import Variant

__all__ = ["Counters", "RunResult", "SimulationError"]


class SimulationError(RuntimeError):
    """The scheduler stalled, or a checked invariant of the cache broke."""


@dataclass
class Counters:
    """What the run did; deterministic for a given workload, limits and variant."""

    requests: int = 0
    steps: int = 0
    preemptions: int = 0
    #: Steps that began with requests in the waiting queue.
    waiting_steps: int = 0
    encoded_items: int = 0
    encoded_embeds: int = 0
    #: Encoder GPU time of the encoded items, under the cost model.
    encoder_seconds: float = 0.0
    #: Encoded again after an earlier encoding of the same identifier was evicted.
    recomputed_items: int = 0
    recomputed_embeds: int = 0
    #: Part of the recomputed: items evicted while a request was still reading
    #: them (partly computed), so encoded again for that same request.
    evicted_in_use_embeds: int = 0
    #: Items a request needed that came from the cache (or from an encoding of
    #: the same identifier in the same step) instead of the encoder.
    cache_hits: int = 0
    hit_embeds: int = 0
    evictions: int = 0
    #: Items wholly inside a request's cached KV prefix: never looked up.
    prefix_skipped_items: int = 0
    prefix_skipped_embeds: int = 0
    #: Tokens looked up in the prefix cache on admission, and those found.
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    #: Distinct identifiers the run saw, and their embeddings (what an
    #: unbounded cache would encode, without prefix caching).
    distinct_items: int = 0
    distinct_embeds: int = 0

    @property
    def hit_rate(self) -> float:
        served = self.cache_hits + self.encoded_items
        return self.cache_hits / served if served else 0.0

    @property
    def item_occurrences(self) -> int:
        """Items served to requests: from the KV prefix cache, the encoder cache or the encoder."""
        return self.prefix_skipped_items + self.cache_hits + self.encoded_items

    @property
    def prefix_served_share(self) -> float:
        """The share of item occurrences the KV prefix cache served (never looked up, never encoded)."""
        total = self.item_occurrences
        return self.prefix_skipped_items / total if total else 0.0

    @property
    def cache_served_share(self) -> float:
        """The share of item occurrences the encoder cache served."""
        total = self.item_occurrences
        return self.cache_hits / total if total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "hit_rate": self.hit_rate,
            "prefix_hit_rate": self.prefix_hit_rate,
            "item_occurrences": self.item_occurrences,
            "prefix_served_share": self.prefix_served_share,
            "cache_served_share": self.cache_served_share,
        }


@dataclass
class RunResult:
    variant: Variant
    encoder_compute_budget: int
    encoder_cache_size: int
    counters: Counters
    #: Wall time inside the manager's methods, summed over the run.
    bookkeeping_seconds: float
    wall_seconds: float
    #: The manager's own ``stats()`` at the end, where it has them.
    manager_stats: dict[str, Any] | None = None
    #: What the host tier did, when the variant has one.
    host: HostTierCounters | None = None

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def bookkeeping_us_per_step(self) -> float:
        return 1e6 * self.bookkeeping_seconds / max(self.counters.steps, 1)
