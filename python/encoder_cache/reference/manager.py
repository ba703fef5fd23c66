"""The twin's ``EncoderCacheManager``: vLLM 0.33's encoder-cache bookkeeping
in plain Python, with the Rust manager's API, semantics and errors."""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any

from encoder_cache.invariants import InvariantError
from encoder_cache.reference.checks import count, request_str, rust_debug
from encoder_cache.reference.event_log import DEFAULT_MAX_PENDING, EventBatch, EventLog
from encoder_cache.reference.policies import POLICIES, EvictionPolicy, make_policy
from encoder_cache.reference.request_fields import (
    input_index,
    read_identifier,
    read_modality,
    read_num_embeds,
    read_request_id,
)
from encoder_cache.reference.state import check_state, parse_state
from encoder_cache.reference.step_hook import StepHooked
from encoder_cache.reference.steps import StepLevelAPI

__all__ = ["EVICTED_MEMORY", "STAT_COUNTERS", "EncoderCacheManager"]


#: How many evicted identifiers a manager remembers to recognise re-encodes
#: (the most recent evictions; an identifier leaves when it is allocated again).
EVICTED_MEMORY = 1 << 16

#: The counters ``stats()`` reports, overall and per modality.
STAT_COUNTERS = (
    "hits",
    "misses",
    "hit_embeds",
    "miss_embeds",
    "evictions",
    "evicted_embeds",
    "reencodes",
    "reencode_embeds",
)


class EncoderCacheManager(StepHooked, StepLevelAPI):
    """vLLM 0.33's encoder-cache bookkeeping in plain Python (all state is live;
    ``request_cached_ids`` is derived from ``request_inputs`` on each access).

    ``policy`` chooses the victims among unreferenced entries: a name from
    :data:`POLICIES` (``"vllm"``, the default, is vLLM 0.33's rule) or an
    :class:`~encoder_cache.reference.policies.EvictionPolicy` object. ``mark_waiting`` /
    ``unmark_waiting`` add lookahead, ``stats()`` counts hits, misses,
    evictions and re-encodes, and assigning ``cache_size`` resizes the cache.
    """

    is_encoder_decoder = False

    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> EncoderCacheManager:
        return cls(cache_size)

    def __init__(self, cache_size: int, *, policy: str | EvictionPolicy = "vllm") -> None:
        self._cache_size = count(cache_size, "cache_size")
        self._policy = make_policy(policy)
        self._policy.reset()
        self._policy.sized(self._cache_size)
        self.num_free_slots = self._cache_size
        self.num_freeable_slots = self._cache_size
        self.cached: dict[str, set[str]] = {}
        self.num_embeds_by_hash: dict[str, int] = {}
        # request id -> input id -> the item it held when cached (frees use this,
        # not the request's current mm_features, which a caller may have changed).
        self.request_inputs: dict[str, dict[int, str]] = {}
        self.request_hash_refs: dict[str, dict[str, int]] = {}
        #: Unreferenced entries -> size, in release order (the policy orders evictions).
        self._released: dict[str, int] = {}
        self.freed: list[str] = []
        #: Lookahead: waiting request id -> its distinct identifiers, and how
        #: many waiting requests need each identifier.
        self.waiting: dict[str, list[str]] = {}
        self.waiting_count: dict[str, int] = {}
        self._tier: dict[str, int] = {}  # evictable entry -> its tier
        self._tier_len = [0, 0]
        self.modality: dict[str, str] = {}  # cached entry -> modality at allocation
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._events: EventLog | None = None  # off until enable_events()
        self.reset_stats()

    @property
    def cache_size(self) -> int:
        """The capacity in embeddings. Assigning resizes: growing adds free
        slots; shrinking evicts unreferenced entries under the policy, or
        raises ValueError and changes nothing when referenced entries exceed it."""
        return self._cache_size

    @cache_size.setter
    def cache_size(self, cache_size: int) -> None:
        self.resize(cache_size)

    @property
    def policy(self) -> str:
        """The eviction policy's name."""
        return self._policy.name

    @property
    def freeable(self) -> dict[str, int]:
        """Unreferenced identifier -> embeddings, next eviction first: the
        policy's order, entries no waiting request needs before those one needs."""
        return {item: self._released[item] for tier in (0, 1) for item in self._policy.order(tier)}

    def resize(self, cache_size: int) -> None:
        cache_size = count(cache_size, "cache_size")
        referenced = self._cache_size - self.num_freeable_slots
        if referenced > cache_size:
            raise ValueError(
                f"cannot resize the cache to {cache_size} embeddings: entries in use take {referenced}; "
                f"free requests first or choose a size of at least {referenced}"
            )
        while self._cache_size - self.num_free_slots > cache_size:
            self._evict_one()
        self._policy.sized(cache_size)
        used = self._cache_size - self.num_free_slots
        self.num_free_slots = cache_size - used
        self.num_freeable_slots = self.num_free_slots + (self.num_freeable_slots - (self._cache_size - used))
        self._cache_size = cache_size

    def reset(self) -> None:
        self.cached.clear()
        self.num_embeds_by_hash.clear()
        self.request_inputs.clear()
        self.request_hash_refs.clear()
        self._released.clear()
        self.freed.clear()
        self.waiting.clear()
        self.waiting_count.clear()
        self._tier.clear()
        self._tier_len = [0, 0]
        self.modality.clear()
        self._evicted.clear()
        self._policy.reset()
        self._policy.sized(self._cache_size)
        self.num_free_slots = self._cache_size
        self.num_freeable_slots = self._cache_size
        if self._events is not None:
            self._events.record_cleared()

    # Lookahead.

    def mark_waiting(self, request: Any, num_computed_tokens: int = 0) -> None:
        """Record that waiting ``request`` will need its items: until
        ``unmark_waiting``, they are evicted only after every evictable entry
        no waiting request needs. Items whose placeholders end at or before
        ``num_computed_tokens`` (its cached KV prefix) are never looked up and
        stay unmarked. ValueError if it is marked already."""
        start = count(num_computed_tokens, "num_computed_tokens")
        request_id = read_request_id(request)
        identifiers = list(
            dict.fromkeys(
                request_str(f.identifier, "mm_features[i].identifier")
                for f in request.mm_features
                if not start
                or count(f.mm_position.offset, "mm_position.offset") + count(f.mm_position.length, "mm_position.length")
                > start
            )
        )
        if request_id in self.waiting:
            raise ValueError(f"request '{request_id}' is already marked waiting")
        self.waiting[request_id] = identifiers
        for identifier in identifiers:
            waiters = self.waiting_count.get(identifier, 0)
            self.waiting_count[identifier] = waiters + 1
            if not waiters and self._tier.get(identifier) == 0:
                self._move(identifier, 1)

    def unmark_waiting(self, request: Any) -> None:
        """Drop ``request``'s lookahead mark; ValueError if it has none."""
        request_id = read_request_id(request)
        identifiers = self.waiting.pop(request_id, None)
        if identifiers is None:
            raise ValueError(f"request '{request_id}' is not marked waiting")
        for identifier in identifiers:
            waiters = self.waiting_count.pop(identifier) - 1
            if waiters:
                self.waiting_count[identifier] = waiters
            elif self._tier.get(identifier) == 1:
                self._move(identifier, 0)

    def _move(self, identifier: str, tier: int) -> None:
        self._policy.retained(identifier)
        self._tier_len[1 - tier] -= 1
        self._tier_len[tier] += 1
        self._tier[identifier] = tier
        self._policy.released(identifier, tier)

    # Metrics.

    def stats(self) -> dict[str, Any]:
        """Counters since construction or ``reset_stats()``, plus the cache's
        current fill: ``entries``, ``used_embeds``, ``freeable_embeds``."""
        stats: dict[str, Any] = dict(self._stats)
        stats["entries"] = len(self.cached)
        stats["used_embeds"] = self._cache_size - self.num_free_slots
        stats["freeable_embeds"] = self.num_freeable_slots - self.num_free_slots
        stats["by_modality"] = {m: dict(c) for m, c in sorted(self._by_modality.items())}
        return stats

    def reset_stats(self) -> None:
        """Zero the counters (the cache's contents stay)."""
        self._stats = dict.fromkeys(STAT_COUNTERS, 0)
        self._by_modality: dict[str, dict[str, int]] = {}

    def _count(self, modality: str, event: str, embeds_event: str, embeds: int) -> None:
        by = self._by_modality.get(modality)
        if by is None:
            by = self._by_modality[modality] = dict.fromkeys(STAT_COUNTERS, 0)
        for counters in (self._stats, by):
            counters[event] += 1
            counters[embeds_event] += embeds

    def check_and_update_cache(self, request: Any, input_id: int) -> bool:
        input_id = input_index(input_id)
        mm_hash = read_identifier(request, input_id)
        request_id = read_request_id(request)
        # A held input changes nothing here under the fix (its request already
        # refers to the entry); the pre-fix variant relies on re-referencing it.
        held = self._holds(request_id, input_id, mm_hash)
        referrers = self.cached.get(mm_hash)
        if referrers is None:
            return False
        if not held:
            # One hit per (request, input) acquisition; a re-check counts nothing.
            self._count(self.modality[mm_hash], "hits", "hit_embeds", self.num_embeds_by_hash[mm_hash])
        if not referrers:
            self.num_freeable_slots -= self._released.pop(mm_hash)
            self._tier_len[self._tier.pop(mm_hash)] -= 1
            self._policy.retained(mm_hash)
        if not held:
            self._policy.accessed(mm_hash)
        referrers.add(request_id)
        self._hold(request_id, input_id, mm_hash)
        return True

    def get_cached_num_encoder_embeds(self, request: Any, input_id: int) -> int | None:
        return self.num_embeds_by_hash.get(read_identifier(request, input_index(input_id)))

    def can_allocate(
        self, request: Any, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool:
        num_embeds = read_num_embeds(request, input_index(input_id))
        if num_embeds > operator.index(encoder_compute_budget):
            return False
        num_embeds += operator.index(num_embeds_to_schedule)
        if num_embeds <= self.num_free_slots:
            return True
        if num_embeds > self.num_freeable_slots:
            return False
        while num_embeds > self.num_free_slots:
            self._evict_one()
        return True

    def _evict_one(self) -> None:
        """Evict the policy's victim: from tier 0 while it has entries, then tier 1."""
        tier = 0 if self._tier_len[0] else 1
        mm_hash = self._policy.victim(tier)
        if self._tier.get(mm_hash) != tier:
            raise RuntimeError(f"the policy chose {mm_hash!r}, which is not an evictable entry of tier {tier}")
        self._policy.evicted(mm_hash)
        del self._tier[mm_hash]
        self._tier_len[tier] -= 1
        size = self._released.pop(mm_hash)
        del self.cached[mm_hash]
        del self.num_embeds_by_hash[mm_hash]
        self._count(self.modality.pop(mm_hash), "evictions", "evicted_embeds", size)
        self._evicted[mm_hash] = None
        if len(self._evicted) > EVICTED_MEMORY:
            self._evicted.popitem(last=False)
        self.freed.append(mm_hash)
        self.num_free_slots += size

    def allocate(self, request: Any, input_id: int) -> None:
        input_id = input_index(input_id)
        mm_hash = read_identifier(request, input_id)
        request_id = read_request_id(request)
        num_embeds = read_num_embeds(request, input_id)
        cached_embeds = self.num_embeds_by_hash.get(mm_hash)
        if cached_embeds is not None and cached_embeds != num_embeds:
            raise ValueError(
                f"item {rust_debug(mm_hash)} is cached with {cached_embeds} embeddings but the request gives {num_embeds}"
            )
        if cached_embeds is not None:
            raise ValueError(
                f"item {rust_debug(mm_hash)} is already cached; take the hit with check_and_update_cache "
                "instead of allocating it again"
            )
        if num_embeds > self.num_free_slots:
            raise ValueError(
                f"cannot allocate {num_embeds} embeddings for item {rust_debug(mm_hash)}: {self.num_free_slots} slots free, "
                f"{self.num_freeable_slots} reclaimable; call can_allocate first so it can evict"
            )
        self._holds(request_id, input_id, mm_hash)
        modality = read_modality(request, input_id)
        self.cached[mm_hash] = {request_id}
        self.num_embeds_by_hash[mm_hash] = num_embeds
        self.modality[mm_hash] = modality
        self._hold(request_id, input_id, mm_hash)
        self.num_free_slots -= num_embeds
        self.num_freeable_slots -= num_embeds
        self._policy.admitted(mm_hash, num_embeds)
        self._count(modality, "misses", "miss_embeds", num_embeds)
        if self._evicted.pop(mm_hash, 0) is None:
            self._count(modality, "reencodes", "reencode_embeds", num_embeds)
        if self._events is not None:
            self._events.record_stored(mm_hash)

    @property
    def request_cached_ids(self) -> dict[str, set[int]]:
        """Snapshot: request id -> set of cached input ids."""
        return {request_id: set(inputs) for request_id, inputs in self.request_inputs.items()}

    def _holds(self, request_id: str, input_id: int, mm_hash: str) -> bool:
        """Whether the request already holds the input as this item; ValueError
        if as another (counting the new one would leave an unreleasable reference)."""
        held = self.request_inputs.get(request_id, {}).get(input_id)
        if held is None:
            return False
        if held != mm_hash:
            raise ValueError(
                f"request '{request_id}' already holds input {input_id} as item '{held}', not '{mm_hash}'; "
                "free that input before reusing its id"
            )
        return True

    def _hold(self, request_id: str, input_id: int, mm_hash: str) -> None:
        inputs = self.request_inputs.setdefault(request_id, {})
        if input_id in inputs:
            return
        inputs[input_id] = mm_hash
        counts = self.request_hash_refs.setdefault(request_id, {})
        counts[mm_hash] = counts.get(mm_hash, 0) + 1

    def get_cached_input_ids(self, request: Any) -> set[int]:
        return set(self.request_inputs.get(read_request_id(request), ()))

    def free_encoder_input(self, request: Any, input_id: int) -> None:
        input_id = input_index(input_id)
        request_id = read_request_id(request)
        held = self.request_inputs.get(request_id)
        if held is None or input_id not in held:
            # Nothing to release, but an input the request does not have is still an error.
            read_identifier(request, input_id)
            return
        mm_hash = held.pop(input_id)
        if self._last_occurrence(request, request_id, mm_hash):
            self._release(request_id, mm_hash)
        if not held:
            del self.request_inputs[request_id]
            self.request_hash_refs.pop(request_id, None)

    def _last_occurrence(self, request: Any, request_id: str, mm_hash: str) -> bool:
        """Count one occurrence off; true when the request holds no other."""
        counts = self.request_hash_refs[request_id]
        counts[mm_hash] -= 1
        if counts[mm_hash]:
            return False
        del counts[mm_hash]
        return True

    def _release(self, request_id: str, mm_hash: str) -> None:
        referrers = self.cached.get(mm_hash)
        if not referrers or request_id not in referrers:
            return
        referrers.remove(request_id)
        if not referrers:
            size = self.num_embeds_by_hash[mm_hash]
            self._released[mm_hash] = size
            self.num_freeable_slots += size
            tier = 1 if mm_hash in self.waiting_count else 0
            self._tier[mm_hash] = tier
            self._tier_len[tier] += 1
            self._policy.released(mm_hash, tier)

    def free(self, request: Any) -> None:
        # Ascending input order, as the Rust manager walks them.
        for input_id in sorted(self.request_inputs.get(read_request_id(request), ())):
            self.free_encoder_input(request, input_id)

    def get_freed_mm_hashes(self) -> list[str]:
        freed = [mm_hash for mm_hash in self.freed if mm_hash not in self.cached]
        self.freed = []
        if self._events is not None:
            self._events.record_removed(freed)
        self._run_step_hook()
        return freed

    # Cache events (not part of the state: a restored manager has them off).

    def enable_events(self, max_pending: int | None = None) -> None:
        """Start recording cache events for ``take_step_events()``; at most
        ``max_pending`` identifiers (default 65,536) wait before the log overflows."""
        max_pending = DEFAULT_MAX_PENDING if max_pending is None else count(max_pending, "max_pending")
        if self._events is None:
            self._events = EventLog(max_pending)
        else:
            self._events.set_max_pending(max_pending)

    def take_step_events(self) -> tuple[bool, list[str], list[tuple[str, int, str]]]:
        """``(cleared, removed, stored)`` since the last call (see the Rust manager's docstring)."""
        if self._events is None:
            raise ValueError("cache events are off: call enable_events() first")
        overflowed, cleared, removed, pending = self._events.drain()
        if overflowed:
            return True, [], self.cached_items()
        stored: dict[str, tuple[str, int, str]] = {}
        for mm_hash in pending:
            if mm_hash in self.num_embeds_by_hash and mm_hash not in stored:
                stored[mm_hash] = (mm_hash, self.num_embeds_by_hash[mm_hash], self.modality[mm_hash])
        return cleared, removed, list(stored.values())

    def take_event_batch(self) -> EventBatch | None:
        """``take_step_events()`` as one ``EventBatch``, or None if nothing changed."""
        cleared, removed, stored = self.take_step_events()
        return EventBatch(cleared, removed, stored) if cleared or removed or stored else None

    def cached_items(self) -> list[tuple[str, int, str]]:
        """Every cached item as ``(identifier, embeds, modality)``, sorted by identifier."""
        return [(mm_hash, self.num_embeds_by_hash[mm_hash], self.modality[mm_hash]) for mm_hash in sorted(self.cached)]

    def get_manager_metadata(self) -> None:
        return None

    # Reliability: the same invariant check and state dump/restore as the Rust managers.

    def check_invariants(self) -> None:
        """Raise :class:`~encoder_cache.InvariantError` naming the first broken rule."""
        check_state(parse_state(self.snapshot()))

    def snapshot(self) -> dict[str, Any]:
        """The whole state as a plain dict, in the Rust managers' shape.

        ``freeable`` lists the unreferenced entries in the policy's order, the
        ones no waiting request needs first. The policy's part of the state is
        listed only where it differs from a fresh ``"vllm"`` manager's, so a
        vLLM-rule snapshot keeps vLLM's shape: ``"policy"``, ``"clock"`` (GDSF)
        and ``"waiting"`` (lookahead marks: request id -> its distinct
        identifiers) at the top; per entry ``"frequency"`` (acquisitions since
        allocation, when not 1 and the policy reads it) and ``"rank"`` (GDSF
        priority or S3-FIFO hit credit, when not 0). Counters (``stats()``) and
        entries' modalities are metrics, not state: a restored manager counts
        later events on its earlier entries under ``"unknown"``."""
        policy = self._policy
        frequencies = policy.name != "vllm"
        requests = sorted(self.request_inputs.keys() | self.request_hash_refs.keys())
        entries = {}
        for item, referrers in sorted(self.cached.items()):
            entry: dict[str, Any] = {"num_embeds": self.num_embeds_by_hash[item], "referrers": sorted(referrers)}
            if frequencies and policy.frequency[item] != 1:
                entry["frequency"] = policy.frequency[item]
            if policy.rank(item) != 0.0:
                entry["rank"] = policy.rank(item)
            entries[item] = entry
        state: dict[str, Any] = {
            "cache_size": self.cache_size,
            "num_free_slots": self.num_free_slots,
            "num_freeable_slots": self.num_freeable_slots,
            "entries": entries,
            "freeable": [[item, self._released[item]] for tier in (0, 1) for item in policy.order(tier)],
            "requests": {
                request_id: {
                    "inputs": [[i, item] for i, item in sorted(self.request_inputs.get(request_id, {}).items())],
                    "occurrences": dict(sorted(self.request_hash_refs.get(request_id, {}).items())),
                }
                for request_id in requests
            },
            "freed": list(self.freed),
        }
        if policy.name != "vllm":
            state["policy"] = policy.name
        if policy.clock != 0.0:
            state["clock"] = policy.clock
        if self.waiting:
            state["waiting"] = {request_id: list(items) for request_id, items in sorted(self.waiting.items())}
        return state

    @classmethod
    def restore(cls, state: Any) -> EncoderCacheManager:
        """A manager in the state ``snapshot()`` gave; ValueError if it breaks an invariant.
        Snapshots without the policy keys restore under ``"vllm"``."""
        state = parse_state(state)
        if state["policy"] not in POLICIES:  # a custom policy's state is not restored
            raise ValueError(
                f"unknown policy '{state['policy']}' in state['policy']; the policies are {', '.join(POLICIES)}"
            )
        try:
            check_state(state)
        except InvariantError as err:
            raise ValueError(f"inconsistent state: {err}") from None
        manager = cls(state["cache_size"], policy=state["policy"])
        policy = manager._policy
        manager.num_free_slots = state["num_free_slots"]
        manager.num_freeable_slots = state["num_freeable_slots"]
        for item, entry in state["entries"].items():
            manager.cached[item] = set(entry["referrers"])
            manager.num_embeds_by_hash[item] = entry["num_embeds"]
            manager.modality[item] = "unknown"
            policy.restored(item, entry["num_embeds"], entry["frequency"])
        for request_id, items in state["waiting"].items():
            manager.waiting[request_id] = list(items)
            for item in items:
                manager.waiting_count[item] = manager.waiting_count.get(item, 0) + 1
        for item, size in state["freeable"]:
            tier = 1 if item in manager.waiting_count else 0
            manager._released[item] = size
            manager._tier[item] = tier
            manager._tier_len[tier] += 1
            policy.restore_released(item, tier, state["entries"][item]["rank"])
        policy.clock = state["clock"]
        for request_id, held in state["requests"].items():
            manager.request_inputs[request_id] = dict(held["inputs"])
            manager.request_hash_refs[request_id] = dict(held["occurrences"])
        manager.freed = state["freed"]
        return manager
