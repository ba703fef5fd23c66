"""A compact continuous-batching scheduler modelled on vLLM V1's, driving an
encoder-cache manager through its step-level API.

Each step: running requests first, in admission order, then waiting ones (not
on a step that preempted), within a token budget (``max_num_batched_tokens``),
a request limit (``max_num_seqs``) and the encoder compute budget. Prefill is
chunked, items may be split across steps. After the step every scheduled
request advances, decodes one token once its prompt is computed, frees the
encoder inputs it has consumed, and when it has all its output tokens it
finishes and frees its references. When the KV cache (``kv_capacity`` tokens)
is full, the newest running request is preempted: it frees its references and
later recomputes from scratch, as in vLLM.

The scheduler counts what the encoder computes and times every manager call;
``check=True`` also verifies the cache's accounting after every step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from encoder_cache import _core, reference
from encoder_cache.budget import SchedulerConfig, compute_mm_encoder_budget
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request
from encoder_cache.simulator.workloads import RequestSpec, Session, Workload, option

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "MANAGERS",
    "Counters",
    "RunResult",
    "SchedulerLimits",
    "SimulationError",
    "simulate",
]

IMPLEMENTATIONS = ("rust", "python")
#: fixed: vLLM 0.33 (PR #54284's fix, O(1) occurrence counts); prefix: before
#: the fix; scan: the fix as the PR first wrote it (scans on every free).
BEHAVIOURS = ("fixed", "prefix", "scan")
#: The Rust manager implements only the fixed behaviour.
MANAGERS: dict[tuple[str, str], Callable[[int], Any]] = {
    ("rust", "fixed"): _core.EncoderCacheManager,
    ("python", "fixed"): reference.EncoderCacheManager,
    ("python", "prefix"): reference.PreFixEncoderCacheManager,
    ("python", "scan"): reference.AnyScanEncoderCacheManager,
}


class SimulationError(RuntimeError):
    """The scheduler stalled, or a checked invariant of the cache broke."""


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's limits; the encoder ones default to ``max_num_batched_tokens``, as in vLLM."""

    # Defaults: vLLM's for an API server on a GPU under 70 GiB.
    max_num_batched_tokens: int = option(2048, "token budget of one step", "N")
    max_num_seqs: int = option(256, "most requests running at once", "N")
    max_num_encoder_input_tokens: int | None = option(
        None, "encoder compute budget per step, in embeddings (default: the token budget)", "N"
    )
    encoder_cache_size: int | None = option(None, "encoder cache size, in embeddings (default: the token budget)", "N")
    kv_capacity: int = option(262144, "KV-cache capacity in tokens; beyond it the newest request is preempted", "N")

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")

    def encoder_budget(self, max_embeds_per_item: dict[str, int]) -> tuple[int, int]:
        """``(encoder_compute_budget, encoder_cache_size)`` as vLLM derives them."""
        config = SchedulerConfig(
            self.max_num_batched_tokens, self.max_num_encoder_input_tokens, self.encoder_cache_size
        )
        return compute_mm_encoder_budget(config, max_embeds_per_item)


@dataclass
class Counters:
    """What the run did; deterministic for a given workload and limits."""

    requests: int = 0
    steps: int = 0
    preemptions: int = 0
    encoded_items: int = 0
    encoded_embeds: int = 0
    #: Encoded again after an earlier encoding of the same identifier was evicted.
    recomputed_items: int = 0
    recomputed_embeds: int = 0
    #: Part of the recomputed: items evicted while a request was still reading
    #: them (partly computed), so encoded again for that same request.
    evicted_in_use_embeds: int = 0
    #: Items a request needed that came from the cache (or from an encoding of
    #: the same identifier in the same step) instead of the encoder.
    cache_hits: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        served = self.cache_hits + self.encoded_items
        return self.cache_hits / served if served else 0.0


@dataclass
class RunResult:
    implementation: str
    behaviour: str
    encoder_compute_budget: int
    encoder_cache_size: int
    counters: Counters
    #: Wall time inside the manager's methods, summed over the run.
    bookkeeping_seconds: float
    wall_seconds: float
    #: Cumulative evicted-in-use embeddings after each step (for the plot).
    evicted_in_use_by_step: list[int]

    @property
    def name(self) -> str:
        return f"{self.implementation}-{self.behaviour}"

    @property
    def bookkeeping_us_per_step(self) -> float:
        return 1e6 * self.bookkeeping_seconds / max(self.counters.steps, 1)


class _Live:
    """A request in flight: the manager's ``Request`` plus the scheduler's state."""

    __slots__ = ("ends", "num_output", "num_tokens", "request", "served", "session", "spec", "starts", "turn")

    def __init__(self, spec: RequestSpec, session: Session, turn: int) -> None:
        self.spec = spec
        features = [
            MultiModalFeature(item.identifier, PlaceholderRange(item.offset, item.length), item.modality)
            for item in spec.items
        ]
        self.request = Request(spec.request_id, features)
        self.session = session
        self.turn = turn
        self.num_tokens = spec.prompt_tokens  # prompt plus the output decoded so far
        self.num_output = 0
        self.served = [False] * len(features)  # encoded or hit since the (re)start
        self.starts = [item.offset for item in spec.items]
        self.ends = [item.offset + item.length for item in spec.items]


class _Run:
    def __init__(
        self,
        workload: Workload,
        limits: SchedulerLimits,
        manager: Any,
        encoder_compute_budget: int,
        check: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.limits = limits
        self.manager = manager
        self.encoder_compute_budget = encoder_compute_budget
        self.check = check
        self.progress = progress
        self.counters = Counters()
        self.bookkeeping = 0.0
        self.clock = 0
        self.kv_used = 0
        self.running: list[_Live] = []
        self.waiting: deque[_Live] = deque()
        self.arrivals: list[tuple[int, int, _Live]] = []
        self.pushed = 0
        self.unfinished = workload.num_requests
        self.encoded_ids: set[str] = set()
        self.evicted_in_use_by_step: list[int] = []
        for session in workload.sessions:
            self._arrive(session.arrival, session, 0)

    def _arrive(self, when: int, session: Session, turn: int) -> None:
        heapq.heappush(self.arrivals, (when, self.pushed, _Live(session.requests[turn], session, turn)))
        self.pushed += 1

    def run(self) -> None:
        while self.unfinished:
            while self.arrivals and self.arrivals[0][0] <= self.clock:
                self.waiting.append(heapq.heappop(self.arrivals)[2])
            if not self.running and not self.waiting:
                self.clock = self.arrivals[0][0]  # idle: jump to the next arrival
                continue
            scheduled = self._schedule()
            if not scheduled:
                raise SimulationError(
                    f"the scheduler stalled at step {self.counters.steps}: "
                    f"{len(self.running)} running and {len(self.waiting)} waiting requests, none schedulable"
                )
            self._update(scheduled)
            self.clock += 1
            self.counters.steps += 1
            self.evicted_in_use_by_step.append(self.counters.evicted_in_use_embeds)
            if self.check:
                self._check_cache()
            if self.progress is not None and self.counters.steps % 64 == 0:
                self.progress(self.counters.requests)
        if self.check:
            self._check_released()
        if self.progress is not None:
            self.progress(self.counters.requests)

    def _try_schedule(self, live: _Live, num_new_tokens: int, budget: int) -> tuple[int, list[int], int, list[int]]:
        """``(num_new_tokens, to_encode, budget_after, repeated)`` for the request."""
        if not live.starts:
            return num_new_tokens, [], budget, []
        start = perf_counter()
        to_encode, num_new_tokens, budget, _, repeated = self.manager.try_schedule_encoder_inputs(
            live.request, live.request.num_computed_tokens, num_new_tokens, budget
        )
        self.bookkeeping += perf_counter() - start
        return num_new_tokens, to_encode, budget, repeated

    def _schedule(self) -> list[tuple[_Live, int]]:
        limits, running = self.limits, self.running
        token_budget = limits.max_num_batched_tokens
        encoder_budget = self.encoder_compute_budget
        scheduled: list[tuple[_Live, int]] = []
        preempted = False
        index = 0
        while index < len(running) and token_budget > 0:
            live = running[index]
            num_new = min(live.num_tokens - live.request.num_computed_tokens, token_budget)
            num_new, to_encode, budget_after, repeated = self._try_schedule(live, num_new, encoder_budget)
            if num_new == 0:
                index += 1
                continue
            while self.kv_used + num_new > limits.kv_capacity:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            if index >= len(running):  # the request preempted itself: nothing left to preempt
                break
            token_budget -= num_new
            if to_encode:
                encoder_budget = budget_after
            self._start(live, num_new, to_encode, repeated, scheduled)
            index += 1
        if not preempted:
            skipped: list[_Live] = []
            while self.waiting and len(running) < limits.max_num_seqs and token_budget > 0:
                live = self.waiting[0]
                num_new = min(live.num_tokens - live.request.num_computed_tokens, token_budget)
                num_new, to_encode, budget_after, repeated = self._try_schedule(live, num_new, encoder_budget)
                if num_new == 0:
                    skipped.append(self.waiting.popleft())
                    continue
                if self.kv_used + num_new > limits.kv_capacity:
                    break
                self.waiting.popleft()
                running.append(live)
                token_budget -= num_new
                if to_encode:
                    encoder_budget = budget_after
                self._start(live, num_new, to_encode, repeated, scheduled)
            self.waiting.extendleft(reversed(skipped))
        start = perf_counter()
        freed = self.manager.get_freed_mm_hashes()
        self.bookkeeping += perf_counter() - start
        self.counters.evictions += len(freed)
        return scheduled

    def _start(
        self,
        live: _Live,
        num_new: int,
        to_encode: list[int],
        repeated: list[int],
        scheduled: list[tuple[_Live, int]],
    ) -> None:
        """Commit ``num_new`` tokens of ``live`` to this step and account for its items."""
        scheduled.append((live, num_new))
        self.kv_used += num_new
        request = live.request
        if to_encode:
            start = perf_counter()
            self.manager.allocate_encoder_inputs(request, to_encode, repeated)
            self.bookkeeping += perf_counter() - start
        # The items whose placeholders overlap this step's tokens.
        computed = request.num_computed_tokens
        first = bisect_right(live.ends, computed)
        last = bisect_left(live.starts, computed + num_new)
        c, served, features = self.counters, live.served, request.mm_features
        for i in to_encode:
            identifier, embeds = features[i].identifier, features[i].mm_position.length
            c.encoded_items += 1
            c.encoded_embeds += embeds
            if identifier in self.encoded_ids:
                c.recomputed_items += 1
                c.recomputed_embeds += embeds
                if served[i]:
                    c.evicted_in_use_embeds += embeds
            else:
                self.encoded_ids.add(identifier)
            served[i] = True
        for i in range(first, last):
            if not served[i]:
                served[i] = True
                c.cache_hits += 1
        if self.check:
            self._check_window(live, first, last, to_encode)

    def _preempt(self, live: _Live) -> None:
        start = perf_counter()
        self.manager.free(live.request)
        self.bookkeeping += perf_counter() - start
        self.kv_used -= live.request.num_computed_tokens
        live.request.num_computed_tokens = 0
        live.served = [False] * len(live.served)
        self.waiting.appendleft(live)
        self.counters.preemptions += 1

    def _update(self, scheduled: list[tuple[_Live, int]]) -> None:
        finished = False
        for live, num_new in scheduled:
            request = live.request
            request.num_computed_tokens += num_new
            if request.num_computed_tokens >= live.num_tokens:
                live.num_output += 1
                live.num_tokens += 1
            done = live.num_output == live.spec.output_tokens
            start = perf_counter()
            if live.starts:
                self.manager.free_encoder_inputs_before(request, request.num_computed_tokens)
            if done:
                self.manager.free(request)
            self.bookkeeping += perf_counter() - start
            if done:
                self._finish(live)
                finished = True
        if finished:
            self.running = [live for live in self.running if live.num_output < live.spec.output_tokens]

    def _finish(self, live: _Live) -> None:
        self.kv_used -= live.request.num_computed_tokens
        self.unfinished -= 1
        self.counters.requests += 1
        if self.check and not all(live.served):
            missing = [i for i, served in enumerate(live.served) if not served]
            raise SimulationError(f"{live.spec.request_id} finished without items {missing} encoded or cached")
        session, turn = live.session, live.turn
        if turn + 1 < len(session.requests):
            self._arrive(self.clock + 1 + session.think[turn], session, turn + 1)

    # Invariants (check=True): slow, they snapshot the manager's state.

    def _check_window(self, live: _Live, first: int, last: int, to_encode: list[int]) -> None:
        request = live.request
        if any(not first <= i < last for i in to_encode):
            raise SimulationError(f"{request.request_id}: items {to_encode} to encode lie outside the step")
        for i in range(first, last):
            if self.manager.get_cached_num_encoder_embeds(request, i) != request.get_num_encoder_embeds(i):
                raise SimulationError(
                    f"{request.request_id}: item {i} is scheduled but neither encoded nor in the cache"
                )

    def _check_cache(self) -> None:
        m = self.manager
        cached, sizes, freeable = m.cached, m.num_embeds_by_hash, m.freeable
        step = self.counters.steps
        if set(cached) != set(sizes) or m.num_free_slots + sum(sizes.values()) != m.cache_size:
            raise SimulationError(f"step {step}: cached entries and free slots do not add up to the cache size")
        if m.num_freeable_slots != m.num_free_slots + sum(freeable.values()):
            raise SimulationError(f"step {step}: freeable slots do not add up")
        if set(freeable) != {h for h, holders in cached.items() if not holders}:
            raise SimulationError(f"step {step}: the freeable entries are not exactly the unreferenced ones")
        active = {live.spec.request_id for live in (*self.running, *self.waiting)}
        holders = set().union(*cached.values())
        if not holders <= active:
            raise SimulationError(f"step {step}: finished requests {sorted(holders - active)} still hold entries")

    def _check_released(self) -> None:
        m = self.manager
        if (
            any(m.cached.values())
            or m.request_cached_ids
            or m.request_hash_refs
            or m.num_freeable_slots != m.cache_size
        ):
            raise SimulationError("references are left after every request finished")


def simulate(
    workload: Workload,
    limits: SchedulerLimits,
    implementation: str = "rust",
    behaviour: str = "fixed",
    *,
    check: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay ``workload`` through the scheduler with one manager variant.

    ``progress`` is called now and then with the number of finished requests.
    """
    factory = MANAGERS.get((implementation, behaviour))
    if factory is None:
        offered = ", ".join(f"{i}-{b}" for i, b in MANAGERS)
        raise ValueError(f"no manager {implementation}-{behaviour}; the variants are {offered}")
    largest = max(workload.requests, key=lambda spec: spec.total_tokens)
    if largest.total_tokens > limits.kv_capacity:
        raise ValueError(
            f"request {largest.request_id} needs {largest.total_tokens} tokens of KV cache, "
            f"more than kv_capacity={limits.kv_capacity}; raise the capacity or shrink the workload"
        )
    compute_budget, cache_size = limits.encoder_budget(workload.config.max_embeds_per_item())
    run = _Run(workload, limits, factory(cache_size), compute_budget, check, progress)
    start = perf_counter()
    run.run()
    wall = perf_counter() - start
    return RunResult(
        implementation,
        behaviour,
        compute_budget,
        cache_size,
        run.counters,
        run.bookkeeping,
        wall,
        run.evicted_in_use_by_step,
    )
