"""A compact continuous-batching scheduler modelled on vLLM V1's, driving an
encoder-cache manager through its step-level API.

Each step: running requests first, in admission order, then waiting ones (not
on a step that preempted), within a token budget (``max_num_batched_tokens``),
a request limit (``max_num_seqs``) and the encoder compute budget. Prefill is
chunked, items may be split across steps. After the step every scheduled
request advances, decodes one token once its prompt is computed, frees the
encoder inputs it has consumed, and when it has all its output tokens it
finishes and frees its references.

The KV cache is a pool of 16-token blocks with vLLM's automatic prefix caching
(``prefix_cache.py``): on admission a request skips the longest cached prefix
of its tokens, and items wholly inside it are never scheduled for encoding.
When the pool runs out, the newest running request is preempted: it frees its
references and blocks and later starts again (its cached blocks may survive).

With ``lookahead`` the scheduler marks every request in the waiting queue on
the manager (``mark_waiting`` when it arrives there, preempted ones included;
``unmark_waiting`` when it is admitted), so the manager evicts entries a
waiting request needs last.

The scheduler counts what the encoder computes, its cost in encoder seconds,
and times every manager call; ``check=True`` also verifies the cache's
accounting after every step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from time import perf_counter
from typing import Any

import encoder_cache
from encoder_cache import _core, reference
from encoder_cache.budget import SchedulerConfig, compute_mm_encoder_budget
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request
from encoder_cache.simulator import oracle
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher, BlockPool
from encoder_cache.simulator.workloads import RequestSpec, option

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "UNBOUNDED",
    "Counters",
    "RunResult",
    "SchedulerLimits",
    "SimulationError",
    "Variant",
    "available_policies",
    "simulate",
    "supports_lookahead",
]

IMPLEMENTATIONS = ("rust", "python")
#: fixed: vLLM 0.33 (PR #54284's fix, O(1) occurrence counts); prefix: before
#: the fix; scan: the fix as the PR first wrote it (scans on every free).
BEHAVIOURS = ("fixed", "prefix", "scan")
#: Managers other than the policies, by (implementation, behaviour): the
#: seed-bug comparison's, and any a test registers (a factory of cache_size).
MANAGERS: dict[tuple[str, str], Callable[[int], Any]] = {
    ("python", "prefix"): reference.PreFixEncoderCacheManager,
    ("python", "scan"): reference.AnyScanEncoderCacheManager,
}
#: A cache size no workload fills: every item is encoded once, then kept.
UNBOUNDED = 1 << 40


def available_policies(implementation: str = "rust") -> tuple[str, ...]:
    """The eviction policies the implementation offers (``("vllm",)`` when it has no choice)."""
    module = encoder_cache if implementation == "rust" else reference
    policies = getattr(module, "POLICIES", None)
    if policies is None and implementation == "rust":
        policies = getattr(_core, "POLICIES", None)
    return tuple(policies) if policies else ("vllm",)


def supports_lookahead(implementation: str = "rust") -> bool:
    cls = _core.EncoderCacheManager if implementation == "rust" else reference.EncoderCacheManager
    return hasattr(cls, "mark_waiting") and hasattr(cls, "unmark_waiting")


@dataclass(frozen=True)
class Variant:
    """One manager configuration: an eviction policy (or ``oracle``), lookahead
    marks or not, the implementation, and the release behaviour."""

    policy: str = "vllm"
    lookahead: bool = False
    implementation: str = "rust"
    behaviour: str = "fixed"
    #: The name to show, when the policy alone does not tell variants apart.
    label: str | None = None

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        return self.policy + ("+lookahead" if self.lookahead else "")

    def manager(self, cache_size: int, future: Any = None) -> Any:
        if self.behaviour != "fixed":
            factory = MANAGERS.get((self.implementation, self.behaviour))
            if factory is None or self.policy != "vllm" or self.lookahead:
                raise ValueError(f"the {self.behaviour} behaviour exists only in python with the vllm policy")
            return factory(cache_size)
        if self.policy == "oracle":
            if not oracle.AVAILABLE:
                raise ValueError("the oracle needs a manager with pluggable policies (encoder_cache.policies)")
            return reference.EncoderCacheManager(cache_size, policy=oracle.OraclePolicy(future))
        cls = _core.EncoderCacheManager if self.implementation == "rust" else reference.EncoderCacheManager
        if self.lookahead and not supports_lookahead(self.implementation):
            raise ValueError(f"the {self.implementation} manager has no mark_waiting/unmark_waiting")
        offered = available_policies(self.implementation)
        if self.policy not in offered:
            raise ValueError(f"no policy {self.policy!r} in the {self.implementation} manager; it offers {offered}")
        if offered == ("vllm",):
            return cls(cache_size)
        return cls(cache_size, policy=self.policy)


class SimulationError(RuntimeError):
    """The scheduler stalled, or a checked invariant of the cache broke."""


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's limits; the encoder ones default to ``max_num_batched_tokens``, as in vLLM."""

    # Defaults: vLLM's for `vllm serve` on an H100-class GPU.
    max_num_batched_tokens: int = option(8192, "token budget of one step", "N")
    max_num_seqs: int = option(256, "most requests running at once", "N")
    max_num_encoder_input_tokens: int | None = option(
        None, "encoder compute budget per step, in embeddings (default: the token budget)", "N"
    )
    encoder_cache_size: int | None = option(None, "encoder cache size, in embeddings (default: the token budget)", "N")
    kv_capacity: int = option(
        262144, "KV-cache capacity in tokens (16-token blocks); when full the newest request is preempted", "N"
    )
    prefix_caching: bool = field(default=True, metadata={"cli": False})

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name != "prefix_caching" and value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.kv_capacity < BLOCK_SIZE:
            raise ValueError(f"kv_capacity must be at least one block ({BLOCK_SIZE} tokens), got {self.kv_capacity}")

    def encoder_budget(self, max_embeds_per_item: dict[str, int]) -> tuple[int, int]:
        """``(encoder_compute_budget, encoder_cache_size)`` as vLLM derives them."""
        config = SchedulerConfig(
            self.max_num_batched_tokens, self.max_num_encoder_input_tokens, self.encoder_cache_size
        )
        return compute_mm_encoder_budget(config, max_embeds_per_item)


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
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate, "prefix_hit_rate": self.prefix_hit_rate}


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

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def bookkeeping_us_per_step(self) -> float:
        return 1e6 * self.bookkeeping_seconds / max(self.counters.steps, 1)


class _Live:
    """A request in flight: the manager's ``Request`` plus the scheduler's state."""

    __slots__ = (
        "blocks",
        "ends",
        "finished",
        "hasher",
        "num_hashed",
        "num_output",
        "num_tokens",
        "origins",
        "request",
        "restarted",
        "served",
        "shareable",
        "spec",
        "starts",
    )

    def __init__(self, spec: RequestSpec, origins: list[tuple[int, int, str]]) -> None:
        self.spec = spec
        features = [
            MultiModalFeature(item.identifier, PlaceholderRange(item.offset, item.length), item.modality)
            for item in spec.items
        ]
        self.request = Request(spec.request_id, features)
        self.num_tokens = spec.prompt_tokens  # prompt plus the output decoded so far
        self.num_output = 0
        self.served = [False] * len(features)  # encoded, hit or in the cached prefix since the (re)start
        self.starts = [item.offset for item in spec.items]
        self.ends = [item.offset + item.length for item in spec.items]
        self.origins = origins
        self.hasher = BlockHasher(origins, spec.items, BLOCK_SIZE)
        self.blocks: list[int] = []
        self.num_hashed = 0
        self.finished: int | None = None  # the step it finished at
        #: Only a session's later turns can share this request's blocks; a
        #: request alone in its session can only find its own blocks again,
        #: after a preemption, so it keys them only then.
        self.shareable = spec.session is not None
        self.restarted = False


def shared_prefix(previous: RequestSpec, spec: RequestSpec) -> int:
    """How many leading tokens ``spec`` shares with ``previous``'s prompt and
    answer: up to the shorter of the two, cut before the first item that is not
    at the same place in both."""
    limit = min(previous.total_tokens, spec.prompt_tokens)
    a_items, b_items = previous.items, spec.items
    j = 0
    while True:
        a = a_items[j] if j < len(a_items) and a_items[j].offset < limit else None
        b = b_items[j] if j < len(b_items) and b_items[j].offset < limit else None
        if a is None and b is None:
            return limit
        if a != b:
            return max(0, min(x.offset - 1 for x in (a, b) if x is not None))
        j += 1


class _Session:
    """A session's last arrived request (its prompt is the next turn's prefix)
    and its last read one (the next turn waits for it to finish)."""

    __slots__ = ("last", "tail", "tail_finished")

    def __init__(self) -> None:
        self.last: _Live | None = None
        self.tail: str | None = None
        self.tail_finished: int | None = None


def _blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class _Run:
    def __init__(
        self,
        specs: Iterator[RequestSpec],
        limits: SchedulerLimits,
        manager: Any,
        encoder_compute_budget: int,
        cost: EncoderCost,
        lookahead: bool,
        observer: Any,
        check: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.limits = limits
        self.manager = manager
        self.encoder_compute_budget = encoder_compute_budget
        self.cost = cost
        self.lookahead = lookahead
        self.observer = observer
        self.check = check
        self.progress = progress
        self.counters = Counters()
        self.bookkeeping = 0.0
        self.clock = 0
        self.pool = BlockPool(limits.kv_capacity // BLOCK_SIZE, limits.prefix_caching)
        self.running: list[_Live] = []
        self.waiting: deque[_Live] = deque()
        self.specs = specs
        self.next_spec: RequestSpec | None = next(specs, None)
        self.delayed: list[tuple[int, int, RequestSpec]] = []
        self.pushed = 0
        self.in_flight = 0  # read, not yet finished
        self.sessions: dict[str, _Session] = {}
        self.waiters: dict[str, RequestSpec] = {}  # request id -> the next turn waiting for it to finish
        self.encoded_ids: set[str] = set()
        self.seen_ids: set[str] = set()

    # Arrivals

    def _read_arrivals(self) -> None:
        while self.next_spec is not None and self.next_spec.arrival <= self.clock:
            spec = self.next_spec
            self.next_spec = next(self.specs, None)
            self.in_flight += 1
            if spec.session is None:
                self._arrive(spec)
                continue
            session = self.sessions.get(spec.session)
            if session is None:
                session = self.sessions[spec.session] = _Session()
            tail, tail_finished = session.tail, session.tail_finished
            session.tail, session.tail_finished = spec.request_id, None
            if spec.think is not None and tail is not None:
                if tail_finished is None:  # the previous turn has not finished: wait for it
                    self.waiters[tail] = spec
                    continue
                when = max(spec.arrival, tail_finished + 1 + spec.think)
                if when > self.clock:
                    self._delay(when, spec)
                    continue
            self._arrive(spec)
        while self.delayed and self.delayed[0][0] <= self.clock:
            self._arrive(heapq.heappop(self.delayed)[2])

    def _delay(self, when: int, spec: RequestSpec) -> None:
        heapq.heappush(self.delayed, (when, self.pushed, spec))
        self.pushed += 1

    def _arrive(self, spec: RequestSpec) -> None:
        """``spec`` enters the waiting queue; a session turn inherits its prefix's token identity."""
        origins = [(0, spec.total_tokens, spec.request_id)]
        live = None
        if spec.session is not None:
            session = self.sessions[spec.session]
            previous = session.last
            shared = 0
            if previous is not None:
                shared = shared_prefix(previous.spec, spec)
                if shared:
                    origins = [(s, min(e, shared), k) for s, e, k in previous.origins if s < shared]
                    origins.append((shared, spec.total_tokens, spec.request_id))
            live = session.last = _Live(spec, origins)
            if shared:
                # Full blocks inside the shared prefix hash as the previous turn's did.
                live.hasher.hashes = previous.hasher.hashes[: shared // BLOCK_SIZE]  # type: ignore[union-attr]
        if live is None:
            live = _Live(spec, origins)
        for item in spec.items:
            if item.identifier not in self.seen_ids:
                self.seen_ids.add(item.identifier)
                self.counters.distinct_items += 1
                self.counters.distinct_embeds += item.length
        self.waiting.append(live)
        self._mark(live)

    def _mark(self, live: _Live) -> None:
        if self.lookahead and live.starts:
            start = perf_counter()
            self.manager.mark_waiting(live.request)
            self.bookkeeping += perf_counter() - start

    def _unmark(self, live: _Live) -> None:
        if self.lookahead and live.starts:
            start = perf_counter()
            self.manager.unmark_waiting(live.request)
            self.bookkeeping += perf_counter() - start

    def _next_event(self) -> int | None:
        times = []
        if self.next_spec is not None:
            times.append(self.next_spec.arrival)
        if self.delayed:
            times.append(self.delayed[0][0])
        return min(times) if times else None

    # The loop

    def run(self) -> None:
        while True:
            self._read_arrivals()
            if not self.running and not self.waiting:
                when = self._next_event()
                if when is None:
                    if self.in_flight:
                        raise SimulationError(f"{self.in_flight} requests wait for session turns that never finish")
                    break
                self.clock = max(when, self.clock + 1)  # idle: jump to the next arrival
                continue
            if not self.waiting and not self.check:
                steps = self._decode_only_steps()
                if steps:
                    self._fast_forward(steps)
                    continue
            if self.waiting:
                self.counters.waiting_steps += 1
            scheduled = self._schedule()
            if not scheduled:
                raise SimulationError(
                    f"the scheduler stalled at step {self.counters.steps}: "
                    f"{len(self.running)} running and {len(self.waiting)} waiting requests, none schedulable"
                )
            self._update(scheduled)
            self.clock += 1
            self.counters.steps += 1
            if self.check:
                self._check_cache()
            if self.progress is not None and self.counters.steps % 64 == 0:
                self.progress(self.counters.requests)
        if self.check:
            self._check_released()
        if self.progress is not None:
            self.progress(self.counters.requests)

    # Decode-only stretches: every running request decodes one token a step,
    # nothing arrives, finishes or needs the encoder, so k steps are taken at
    # once with the same outcome as taking them one by one (check=True takes
    # them one by one, and the tests compare the two).

    def _decode_only_steps(self) -> int:
        running = self.running
        if len(running) > self.limits.max_num_batched_tokens:
            return 0
        steps = None
        for live in running:
            if live.num_tokens - live.request.num_computed_tokens != 1:
                return 0
            left = live.spec.output_tokens - live.num_output - 1  # the finishing step runs normally
            if steps is None or left < steps:
                steps = left
        when = self._next_event()
        if steps is None or (when is not None and when - self.clock < steps):
            steps = 0 if steps is None else when - self.clock  # type: ignore[operator]
        if steps < 2:
            return 0
        need = sum(_blocks_for(live.request.num_computed_tokens + steps) - len(live.blocks) for live in running)
        return steps if need <= self.pool.num_free else 0

    def _fast_forward(self, steps: int) -> None:
        pool = self.pool
        for live in self.running:
            request = live.request
            computed = request.num_computed_tokens + steps
            need = _blocks_for(computed) - len(live.blocks)
            if need > 0:
                live.blocks += pool.allocate(need)
            request.num_computed_tokens = computed
            live.num_output += steps
            live.num_tokens += steps
            if live.shareable:
                self._key_full_blocks(live)
        self.clock += steps
        before = self.counters.steps
        self.counters.steps += steps
        if self.progress is not None and before // 64 != self.counters.steps // 64:
            self.progress(self.counters.requests)

    def _try_schedule(
        self, live: _Live, computed: int, num_new_tokens: int, budget: int
    ) -> tuple[int, list[int], int, list[int]]:
        """``(num_new_tokens, to_encode, budget_after, repeated)`` for the request."""
        if not live.starts or live.ends[-1] <= computed:
            return num_new_tokens, [], budget, []
        start = perf_counter()
        to_encode, num_new_tokens, budget, _, repeated = self.manager.try_schedule_encoder_inputs(
            live.request, computed, num_new_tokens, budget
        )
        self.bookkeeping += perf_counter() - start
        return num_new_tokens, to_encode, budget, repeated

    def _schedule(self) -> list[tuple[_Live, int]]:
        limits, running, pool = self.limits, self.running, self.pool
        token_budget = limits.max_num_batched_tokens
        encoder_budget = self.encoder_compute_budget
        scheduled: list[tuple[_Live, int]] = []
        preempted = False
        index = 0
        while index < len(running) and token_budget > 0:
            live = running[index]
            computed = live.request.num_computed_tokens
            num_new = min(live.num_tokens - computed, token_budget)
            num_new, to_encode, budget_after, repeated = self._try_schedule(live, computed, num_new, encoder_budget)
            if num_new == 0:
                index += 1
                continue
            need = -(-(computed + num_new) // BLOCK_SIZE) - len(live.blocks)
            if need <= 0:
                token_budget -= num_new
                if to_encode:
                    encoder_budget = budget_after
                self._start(live, num_new, to_encode, repeated, scheduled)
                index += 1
                continue
            while need > len(pool.free):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            if index >= len(running):  # the request preempted itself: nothing left to preempt
                break
            live.blocks += pool.allocate(need)
            token_budget -= num_new
            if to_encode:
                encoder_budget = budget_after
            self._start(live, num_new, to_encode, repeated, scheduled)
            index += 1
        if not preempted:
            skipped: list[_Live] = []
            while self.waiting and len(running) < limits.max_num_seqs and token_budget > 0:
                live = self.waiting[0]
                request = live.request
                # The cached prefix: full blocks, never the last token (it must be computed).
                if live.shareable or live.restarted:
                    cached = pool.longest_prefix(live.hasher.upto((live.num_tokens - 1) // BLOCK_SIZE))
                else:
                    cached = []
                computed = len(cached) * BLOCK_SIZE
                num_new = min(live.num_tokens - computed, token_budget)
                num_new, to_encode, budget_after, repeated = self._try_schedule(live, computed, num_new, encoder_budget)
                if num_new == 0:
                    skipped.append(self.waiting.popleft())
                    continue
                need = _blocks_for(computed + num_new) - len(cached)
                if need > pool.num_free - pool.num_reclaimed_by(cached):
                    break
                self.waiting.popleft()
                self._unmark(live)
                running.append(live)
                pool.touch(cached)
                live.blocks = cached + pool.allocate(need)
                live.num_hashed = len(cached)
                request.num_computed_tokens = computed
                if pool.caching:
                    self.counters.prefix_query_tokens += live.num_tokens
                    self.counters.prefix_hit_tokens += computed
                if computed:
                    self._skip_prefix_items(live, computed)
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

    def _skip_prefix_items(self, live: _Live, computed: int) -> None:
        c, served = self.counters, live.served
        for i in range(bisect_right(live.ends, computed)):
            if not served[i]:
                served[i] = True
                c.prefix_skipped_items += 1
                c.prefix_skipped_embeds += live.spec.items[i].length
                if self.observer is not None:
                    item = live.spec.items[i]
                    self.observer.served(live.spec.request_id, i, item.identifier, self.counters.steps)

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
        request = live.request
        if to_encode:
            start = perf_counter()
            self.manager.allocate_encoder_inputs(request, to_encode, repeated)
            self.bookkeeping += perf_counter() - start
        # The items whose placeholders overlap this step's tokens.
        computed = request.num_computed_tokens
        first = bisect_right(live.ends, computed)
        last = bisect_left(live.starts, computed + num_new)
        if first >= last and not to_encode:
            return
        c, served, items, observer = self.counters, live.served, live.spec.items, self.observer
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
                observer.served(live.spec.request_id, i, item.identifier, step)
            served[i] = True
        for i in range(first, last):
            if not served[i]:
                served[i] = True
                c.cache_hits += 1
                c.hit_embeds += items[i].length
                if observer is not None:
                    observer.served(live.spec.request_id, i, items[i].identifier, step)
        if self.check:
            self._check_window(live, first, last, to_encode)

    def _key_full_blocks(self, live: _Live) -> None:
        """Key the request's newly full computed blocks in the prefix cache."""
        pool = self.pool
        full = live.request.num_computed_tokens // BLOCK_SIZE
        if pool.caching and full > live.num_hashed:
            hashes = live.hasher.upto(full)
            for b in range(live.num_hashed, full):
                pool.cache(live.blocks[b], hashes[b])
            live.num_hashed = full

    def _preempt(self, live: _Live) -> None:
        start = perf_counter()
        self.manager.free(live.request)
        self.bookkeeping += perf_counter() - start
        if not live.shareable:
            self._key_full_blocks(live)
            live.restarted = True
        self.pool.release(live.blocks)
        live.blocks = []
        live.num_hashed = 0
        live.request.num_computed_tokens = 0
        if self.observer is not None:
            for i, item in enumerate(live.spec.items):
                if live.served[i]:
                    self.observer.needed_again(live.spec.request_id, i, item.identifier)
        live.served = [False] * len(live.served)
        self.waiting.appendleft(live)
        self._mark(live)
        self.counters.preemptions += 1

    def _update(self, scheduled: list[tuple[_Live, int]]) -> None:
        finished = False
        for live, num_new in scheduled:
            request = live.request
            request.num_computed_tokens += num_new
            computed = request.num_computed_tokens
            if live.shareable:
                self._key_full_blocks(live)
            if computed >= live.num_tokens:
                live.num_output += 1
                live.num_tokens += 1
            done = live.num_output == live.spec.output_tokens
            start = perf_counter()
            if live.starts:
                self.manager.free_encoder_inputs_before(request, computed)
            if done:
                self.manager.free(request)
            self.bookkeeping += perf_counter() - start
            if done:
                self._finish(live)
                finished = True
        if finished:
            self.running = [live for live in self.running if live.finished is None]

    def _finish(self, live: _Live) -> None:
        self.pool.release(live.blocks)
        live.blocks = []
        live.finished = self.clock
        self.in_flight -= 1
        self.counters.requests += 1
        if self.check and not all(live.served):
            missing = [i for i, served in enumerate(live.served) if not served]
            raise SimulationError(f"{live.spec.request_id} finished without items {missing} encoded or cached")
        spec = live.spec
        if spec.session is not None:
            session = self.sessions[spec.session]
            if session.tail == spec.request_id:
                session.tail_finished = self.clock
            waiter = self.waiters.pop(spec.request_id, None)
            if waiter is not None:
                self._delay(max(waiter.arrival, self.clock + 1 + (waiter.think or 0)), waiter)

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
        step = self.counters.steps
        try:
            if not isinstance(getattr(m, "_policy", None), oracle.OraclePolicy):  # the twin checks built-ins only
                m.check_invariants()
        except Exception as exc:
            raise SimulationError(f"step {step}: {exc}") from None
        snapshot = m.snapshot()
        entries = snapshot["entries"]
        if m.num_free_slots + sum(e["num_embeds"] for e in entries.values()) != m.cache_size:
            raise SimulationError(f"step {step}: cached entries and free slots do not add up to the cache size")
        active = {live.spec.request_id for live in (*self.running, *self.waiting)}
        holders = {r for e in entries.values() for r in e["referrers"]}
        if not holders <= active:
            raise SimulationError(f"step {step}: finished requests {sorted(holders - active)} still hold entries")
        pool = self.pool
        held = sum(len(live.blocks) for live in self.running)
        if pool.num_free + len({b for live in self.running for b in live.blocks}) != pool.num_blocks or held < 0:
            raise SimulationError(f"step {step}: KV blocks held and free do not add up")

    def _check_released(self) -> None:
        m = self.manager
        snapshot = m.snapshot()
        if any(e["referrers"] for e in snapshot["entries"].values()) or m.num_freeable_slots != m.cache_size:
            raise SimulationError("references are left after every request finished")
        if self.pool.num_free != self.pool.num_blocks:
            raise SimulationError("KV blocks are left after every request finished")


def simulate(
    workload: Any,
    limits: SchedulerLimits,
    variant: Variant | str | None = None,
    behaviour: str | None = None,
    *,
    cache_size: int | None = None,
    cost: EncoderCost | None = None,
    check: bool = False,
    progress: Callable[[int], None] | None = None,
    observer: Any = None,
) -> RunResult:
    """Replay ``workload`` (a generated ``Workload`` or a ``TraceWorkload``)
    through the scheduler with one manager variant.

    ``cache_size`` overrides the encoder cache size vLLM would derive;
    ``progress`` is called now and then with the number of finished requests;
    ``observer`` is told when each item occurrence is served (the oracle's first pass).
    ``simulate(workload, limits, implementation, behaviour)`` (two names) runs
    the manager ``MANAGERS`` holds for them.
    """
    if isinstance(variant, str):
        variant = Variant("vllm", False, variant, behaviour or "fixed")
    variant = Variant() if variant is None else variant
    cost = EncoderCost() if cost is None else cost
    compute_budget, derived_size = limits.encoder_budget(workload.max_embeds_per_item())
    size = derived_size if cache_size is None else max(cache_size, *workload.max_embeds_per_item().values(), 1)
    future = None
    if variant.policy == "oracle":
        recorder = oracle.Recorder()
        simulate(workload, limits, Variant(), cache_size=size, cost=cost, observer=recorder)
        future = oracle.Future(recorder)
        observer = future
    manager = variant.manager(size, future)
    blocks = limits.kv_capacity // BLOCK_SIZE
    run = _Run(
        _checked(workload.requests(), blocks, limits),
        limits,
        manager,
        compute_budget,
        cost,
        variant.lookahead,
        observer,
        check,
        progress,
    )
    start = perf_counter()
    run.run()
    wall = perf_counter() - start
    stats = manager.stats() if hasattr(manager, "stats") else None
    return RunResult(variant, compute_budget, size, run.counters, run.bookkeeping, wall, stats)


def _checked(specs: Iterator[RequestSpec], blocks: int, limits: SchedulerLimits) -> Iterator[RequestSpec]:
    for spec in specs:
        if _blocks_for(spec.total_tokens) > blocks:
            raise ValueError(
                f"request {spec.request_id} needs {spec.total_tokens} tokens of KV cache, "
                f"more than kv_capacity={limits.kv_capacity}; raise the capacity or shrink the workload"
            )
        yield spec
