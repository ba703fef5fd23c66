"""The scheduler model: vLLM 0.33's ``Scheduler`` (one full-attention KV
group), rule for rule, driving an encoder-cache manager through its
step-level API.

Each step: running requests first, in admission order, then waiting ones (not
on a step that preempted), within the token budget, the request limit and the
encoder compute budget; prefill is chunked, items may be split across steps.
A waiting request is admitted when its whole prompt fits in free KV blocks
(``reserve_full_isl``) or else its chunk. When the pool runs out, the newest
running request is preempted: it frees its references and blocks and goes
back to the front of the queue. The KV pool and its prefix cache are vLLM's
(``prefix_cache.py``). With async scheduling (vLLM's default) the engine
keeps two steps in flight, as vLLM's batch queue does: outputs, frees and
finishes are seen a step after the step is scheduled. Lookahead marks are
set as ``encoder_cache.vllm``'s scheduler subclasses set them. What each item
occurrence cost is counted by ``ledger.py``; ``check=True`` also verifies the
cache's accounting after every step. Arrivals come from ``arrivals.py``, the
manager from ``variants.py``; the result is a ``results.RunResult``.

With a host tier (``host_tier.py``) an item the GPU encoder cache lacks is
loaded from host memory when the tier holds it ready, instead of encoded; the
tier saves what the GPU encodes, and the worker's copies of a step end when
its output is processed.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from encoder_cache.simulator import checks, oracle
from encoder_cache.simulator.arrivals import Arrivals
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.host_tier import HostTierModel
from encoder_cache.simulator.inflight import PREEMPTED, RUNNING, Batch, Live, blocks_for
from encoder_cache.simulator.ledger import Ledger
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockPool
from encoder_cache.simulator.prompts import Prompts
from encoder_cache.simulator.results import Counters, RunResult, SimulationError
from encoder_cache.simulator.spec import Answer, RequestSpec
from encoder_cache.simulator.variants import Variant

__all__ = ["simulate"]

#: How many sessions' last requests are kept to reuse their block hashes.
RECENT_SESSIONS = 256


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
        host: HostTierModel | None = None,
    ) -> None:
        self.limits = limits
        self.host = host
        self.manager = manager
        self.encoder_compute_budget = encoder_compute_budget
        self.lookahead = lookahead
        self.check = check
        self.progress = progress
        self.counters = Counters()
        self.bookkeeping = 0.0
        self.clock = 0
        self.pool = BlockPool(limits.kv_capacity // BLOCK_SIZE, limits.prefix_caching)
        self.depth = 2 if limits.async_scheduling else 1  # steps in flight, as vLLM's batch queue
        self.marked: dict[str, Live] = {}  # lookahead marks: the waiting queue at the last step's start
        self.finished_since_schedule = False
        self.running: list[Live] = []
        self.waiting: deque[Live] = deque()
        self.batches: deque[Batch] = deque()  # scheduled steps whose output is not processed yet
        self.idle = 0  # steps in a row that scheduled nothing
        self.arrivals = Arrivals(specs)
        self.prompts = Prompts()
        #: Recent sessions' last requests: a turn reuses its prefix's block hashes (a bounded cache, not state).
        self.recent: OrderedDict[str, tuple[RequestSpec, list[int]]] = OrderedDict()
        self.ledger = Ledger(self.counters, cost, observer)

    # Arrivals

    def _read_arrivals(self) -> None:
        for spec in self.arrivals.due(self.clock):
            self._arrive(spec)

    def _arrive(self, spec: RequestSpec) -> None:
        """``spec`` enters the waiting queue."""
        live = Live(spec, self.prompts.runs(spec))
        if spec.session is not None and spec.segments is not None:
            self._reuse_hashes(live)
        self.ledger.arrived(spec)
        self.waiting.append(live)

    def _reuse_hashes(self, live: Live) -> None:
        """A session turn extending its previous turn hashes that turn's prompt and answer alike:
        take the full blocks' hashes it has already computed."""
        spec, recent = live.spec, self.recent
        assert spec.session is not None and spec.segments is not None
        last = recent.pop(spec.session, None)
        if last is not None:
            previous, hashes = last
            n = len(previous.segments)  # type: ignore[arg-type]
            if spec.segments[n : n + 1] == (Answer(previous.request_id, previous.output_tokens),) and (
                spec.segments[:n] == previous.segments
            ):
                live.hasher.hashes = hashes[: previous.total_tokens // BLOCK_SIZE]
        recent[spec.session] = (spec, live.hasher.hashes)  # the list the hasher goes on filling
        if len(recent) > RECENT_SESSIONS:
            recent.popitem(last=False)

    def _sync_marks(self) -> None:
        """Lookahead: mark the waiting queue's requests, as ``encoder_cache.vllm``'s
        scheduler subclasses do at the start of every step (requests admitted
        or finished since are unmarked, new and preempted ones marked, each
        from where its cached KV prefix ends then)."""
        marked = self.marked
        waiting = {live.spec.request_id: live for live in self.waiting if live.starts}
        start = perf_counter()
        for request_id in [r for r in marked if waiting.get(r) is not marked[r]]:
            self.manager.unmark_waiting(marked.pop(request_id).request)
        for request_id, live in waiting.items():
            if request_id not in marked:
                self.manager.mark_waiting(live.request, len(self._cached_prefix(live)) * BLOCK_SIZE)
                marked[request_id] = live
        self.bookkeeping += perf_counter() - start

    # The loop: vLLM's engine core. Synchronously each step is scheduled and
    # its output processed; with async scheduling a batch queue two deep
    # schedules the next step before processing the previous one's output.

    def run(self, until: int | None = None) -> None:
        """Run the workload to its end; or, for a driver feeding ``arrivals`` (whose
        ``next_event()`` then gives ``until`` when nothing else is due), up to step ``until``."""
        batches = self.batches
        while until is None or self.clock < until:
            self._read_arrivals()
            if not self.running and not self.waiting and not batches:
                when = self.arrivals.next_event()
                if when is None:
                    if self.arrivals.in_flight:
                        raise SimulationError(
                            f"{self.arrivals.in_flight} requests wait for session turns that never finish"
                        )
                    break
                self.clock = max(when, self.clock + 1)  # idle: jump to the next arrival
                continue
            if not self.waiting and not self.check:
                steps = self._decode_only_steps(batches)
                if steps:
                    self._fast_forward(steps)
                    continue
            if self.running or self.waiting or self.finished_since_schedule:
                waiting = bool(self.waiting)
                batch = self._schedule()
                self.finished_since_schedule = False
                if batch.tokens:
                    self.counters.steps += 1
                    self.counters.waiting_steps += waiting
                    self.idle = 0
                else:
                    self.idle += 1
                    if self.idle > 2 * self.depth:
                        raise SimulationError(
                            f"the scheduler stalled at step {self.counters.steps}: "
                            f"{len(self.running)} running and {len(self.waiting)} waiting requests, none schedulable"
                        )
                batches.appendleft(batch)
                if len(batches) < self.depth and (batch.tokens or self.running or self.waiting):
                    self._tick()
                    continue
            if batches:
                self._update(batches.pop())
            self._tick()
        else:
            return  # paused at ``until``
        if self.check:
            checks.released(self.manager, self.pool)
        if self.progress is not None:
            self.progress(self.counters.requests)

    def earliest_finish(self) -> int | None:
        """The earliest step at which a request in flight can finish (a step
        processes at most one token of each request), or None when none is in flight."""
        left = [live.spec.output_tokens - live.num_output for live in (*self.running, *self.waiting)]
        return self.clock + max(min(left) - 1, 0) if left else None

    def _tick(self) -> None:
        self.clock += 1
        if self.check:
            active = {live.spec.request_id for live in (*self.running, *self.waiting)}
            checks.cache(self.manager, self.counters.steps, self.pool, active, (r.blocks for r in self.running))
        if self.progress is not None and self.counters.steps % 64 == 0:
            self.progress(self.counters.requests)

    # Decode-only stretches: every running request decodes one token a step,
    # nothing waits, arrives, finishes or needs the encoder, so k steps are
    # taken at once with the same outcome as taking them one by one
    # (check=True takes them one by one, and the tests compare the two). With
    # async scheduling the stretch starts and ends with one step in flight:
    # each request has one output placeholder, and its last scheduled token's
    # block is keyed only once that token comes back.

    def _decode_only_steps(self, batches: deque[Batch]) -> int:
        running = self.running
        if self.marked or len(running) > self.limits.max_num_batched_tokens:
            return 0
        if self.depth > 1:
            if len(batches) != 1 or len(batches[0].entries) != len(running):
                return 0
            if any(n != 1 or not samples or live.status != RUNNING for live, n, samples in batches[0].entries):
                return 0
        elif batches:
            return 0
        lag = self.depth - 1  # tokens of each request in flight
        margin = 1 + 2 * lag  # the last steps (and the async skip before them) run normally
        steps = None
        for live in running:
            if live.num_tokens + lag - live.request.num_computed_tokens != 1 or live.placeholders != lag:
                return 0
            left = live.spec.output_tokens - live.num_output - margin
            if steps is None or left < steps:
                steps = left
        when = self.arrivals.next_event()
        if steps is None or (when is not None and when - self.clock < steps):
            steps = 0 if steps is None else when - self.clock  # type: ignore[operator]
        if steps < 2:
            return 0
        need = sum(blocks_for(live.request.num_computed_tokens + steps) - len(live.blocks) for live in running)
        return steps if need <= self.pool.num_free else 0

    def _fast_forward(self, steps: int) -> None:
        pool = self.pool
        for live in self.running:
            request = live.request
            computed = request.num_computed_tokens + steps
            need = blocks_for(computed) - len(live.blocks)
            if need > 0:
                live.blocks += pool.allocate(need)
            request.num_computed_tokens = computed
            live.num_output += steps
            live.num_tokens += steps
            # Each step keyed the blocks its tokens filled, up to the last token sampled.
            self._cache_blocks(live, computed - live.in_flight)
        self.clock += steps
        before = self.counters.steps
        self.counters.steps += steps
        if self.progress is not None and before // 64 != self.counters.steps // 64:
            self.progress(self.counters.requests)

    def _cached_prefix(self, live: Live) -> list[int]:
        """The blocks of ``live``'s prompt in the prefix cache now: full blocks,
        never the last token (it must be computed)."""
        return self.pool.longest_prefix(live.hasher.upto((live.num_tokens - 1) // BLOCK_SIZE))

    def _try_schedule(
        self, live: Live, computed: int, num_new_tokens: int, budget: int
    ) -> tuple[int, list[int], int, list[int], list[int]]:
        """``(num_new_tokens, to_encode, budget_after, repeated, to_load)`` for the request."""
        if not live.starts or live.ends[-1] <= computed:
            return num_new_tokens, [], budget, [], []
        start = perf_counter()
        if self.host is None:
            to_encode, num_new_tokens, budget, to_load, repeated = self.manager.try_schedule_encoder_inputs(
                live.request, computed, num_new_tokens, budget
            )
        else:
            to_encode, num_new_tokens, budget, to_load, repeated = self.manager.try_schedule_encoder_inputs(
                live.request, computed, num_new_tokens, budget, has_remote_item=self.host.has_cache_item
            )
        self.bookkeeping += perf_counter() - start
        return num_new_tokens, to_encode, budget, repeated, to_load

    def _schedule(self) -> Batch:
        """vLLM 0.33's ``Scheduler.schedule()`` for one full-attention KV group."""
        if self.lookahead:
            self._sync_marks()
        limits, running, pool = self.limits, self.running, self.pool
        token_budget = limits.max_num_batched_tokens
        encoder_budget = self.encoder_compute_budget
        batch = Batch()
        preempted = False
        index = 0
        while index < len(running) and token_budget > 0:
            live = running[index]
            computed = live.request.num_computed_tokens
            if live.placeholders and computed + 2 - live.placeholders >= live.spec.total_tokens:
                index += 1  # async: its last token is already scheduled
                continue
            num_new = min(live.num_tokens + live.placeholders - computed, token_budget)
            num_new, to_encode, budget_after, repeated, to_load = self._try_schedule(
                live, computed, num_new, encoder_budget
            )
            if num_new == 0:
                index += 1
                continue
            need = blocks_for(computed + num_new) - len(live.blocks)
            while need > pool.num_free:
                # Preempt the newest running request (perhaps this one).
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            if live.status != RUNNING:
                break
            if need > 0:
                live.blocks += pool.allocate(need)
            if (computed + num_new) // BLOCK_SIZE > live.num_cached:
                self._cache_blocks(live, computed + num_new)
            token_budget -= num_new
            if to_encode:
                encoder_budget = budget_after
            self._start(live, num_new, to_encode, repeated, batch, to_load)
            index += 1
        if not preempted:
            skipped: list[Live] = []
            while self.waiting and token_budget > 0 and len(running) < limits.max_num_seqs:
                live = self.waiting[0]
                if live.stale:
                    # Async: a step of it from before its preemption is still in flight.
                    skipped.append(self.waiting.popleft())
                    continue
                request = live.request
                cached = self._cached_prefix(live)
                computed = len(cached) * BLOCK_SIZE
                num_new = min(live.num_tokens - computed, token_budget)
                num_new, to_encode, budget_after, repeated, to_load = self._try_schedule(
                    live, computed, num_new, encoder_budget
                )
                if num_new == 0:
                    skipped.append(self.waiting.popleft())
                    continue
                # Admission: the whole prompt must fit (scheduler_reserve_full_isl),
                # or else this step's chunk; cached hits in the free queue count as taken.
                taken = pool.num_evictable(cached) - len(cached)
                whole = blocks_for(live.num_tokens) + taken
                if (limits.reserve_full_isl and whole > pool.num_free) or (
                    blocks_for(computed + num_new) + taken > pool.num_free
                ):
                    if live.starts:
                        start = perf_counter()
                        self.manager.free(request)  # drop what the lookup took, as vLLM does
                        self.bookkeeping += perf_counter() - start
                    break
                self.waiting.popleft()
                running.append(live)
                live.status = RUNNING
                pool.touch(cached)
                live.blocks = cached + pool.allocate(blocks_for(computed + num_new) - len(cached))
                live.num_cached = len(cached)
                request.num_computed_tokens = computed
                self._cache_blocks(live, computed + num_new)
                if pool.caching:
                    self.counters.prefix_query_tokens += live.num_tokens
                    self.counters.prefix_hit_tokens += computed
                if computed:
                    self.ledger.admitted(live.spec, live.served, live.ends, computed)
                token_budget -= num_new
                if to_encode:
                    encoder_budget = budget_after
                self._start(live, num_new, to_encode, repeated, batch, to_load)
            self.waiting.extendleft(reversed(skipped))
        start = perf_counter()
        freed = self.manager.get_freed_mm_hashes()
        self.bookkeeping += perf_counter() - start
        self.counters.evictions += len(freed)
        if self.host is not None:
            batch.host_work = self.host.take_step()
        # After the step is scheduled: the requests advance; one that is past
        # its prompt samples a token (with async scheduling a placeholder
        # stands for it until the step's output comes back).
        depth = self.depth
        entries = batch.entries
        for k, (live, num_new, _) in enumerate(entries):
            request = live.request
            request.num_computed_tokens += num_new
            live.in_flight += num_new
            samples = request.num_computed_tokens >= live.num_tokens + live.placeholders
            if samples and depth > 1:
                live.placeholders += 1
            entries[k] = (live, num_new, samples)
        return batch

    def _cache_blocks(self, live: Live, num_tokens: int) -> None:
        """Key the request's full blocks up to ``num_tokens`` (of the tokens it has so far)."""
        pool = self.pool
        full = min(num_tokens, live.num_tokens) // BLOCK_SIZE
        if pool.caching and full > live.num_cached:
            hashes = live.hasher.upto(full)
            blocks = live.blocks
            for b in range(live.num_cached, full):
                pool.cache(blocks[b], hashes[b])
            live.num_cached = full

    def _start(
        self,
        live: Live,
        num_new: int,
        to_encode: list[int],
        repeated: list[int],
        batch: Batch,
        to_load: list[int],
    ) -> None:
        """Commit ``num_new`` tokens of ``live`` to this step and account for its items."""
        batch.entries.append((live, num_new, False))
        batch.tokens += num_new
        request = live.request
        if to_encode or to_load:
            start = perf_counter()
            self.manager.allocate_encoder_inputs(request, to_encode + to_load if to_load else to_encode, repeated)
            self.bookkeeping += perf_counter() - start
            if self.host is not None:
                self._host_alloc(live, to_encode, to_load)
        computed = request.num_computed_tokens
        first, last = self.ledger.scheduled(
            live.spec, live.served, live.starts, live.ends, computed, num_new, to_encode
        )
        if self.check and (first < last or to_encode):
            checks.window(self.manager, request, first, last, to_encode)

    def _host_alloc(self, live: Live, to_encode: list[int], to_load: list[int]) -> None:
        """The host tier's part of an allocation, in vLLM's order: encoded items, then loaded ones."""
        host, items, served = self.host, live.spec.items, live.served
        assert host is not None
        host.missed(len(to_encode))
        for i in to_encode:
            host.after_alloc(items[i].identifier, items[i].length)
        for i in to_load:
            host.after_alloc(items[i].identifier, items[i].length)
            served[i] = True  # loaded: neither encoded nor a hit of the GPU cache

    def _preempt(self, live: Live) -> None:
        start = perf_counter()
        self.manager.free(live.request)
        self.bookkeeping += perf_counter() - start
        self.pool.release(live.blocks)
        live.blocks = []
        live.num_cached = 0
        live.drained = False
        live.request.num_computed_tokens = 0
        live.status = PREEMPTED
        live.stale = live.in_flight  # its steps in flight deliver their tokens, then it may resume
        live.placeholders = 0
        self.ledger.restarted(live.spec, live.served)
        self.waiting.appendleft(live)
        self.counters.preemptions += 1

    def _update(self, batch: Batch) -> None:
        """vLLM's ``update_from_output`` for a processed step: sampled tokens are
        appended, consumed encoder inputs freed, finished requests released."""
        if batch.host_work is not None:
            self.host.completed(batch.host_work)  # type: ignore[union-attr]
        finished = False
        for live, num_new, samples in batch.entries:
            live.in_flight -= num_new
            stale = live.stale > 0
            if stale:
                live.stale -= num_new
            if live.finished is not None:
                continue
            request = live.request
            if live.starts and not live.drained:
                # Inputs whose placeholders end before the confirmed progress are in the KV cache.
                position = request.num_computed_tokens - live.placeholders
                start = perf_counter()
                self.manager.free_encoder_inputs_before(request, position)
                self.bookkeeping += perf_counter() - start
                live.drained = position >= live.ends[-1]  # nothing left to free until a restart
            if not samples:
                continue
            was_running = live.status == RUNNING
            had_placeholders = live.placeholders > 0
            live.num_output += 1
            live.num_tokens += 1
            if not stale and had_placeholders:
                live.placeholders -= 1
                if was_running and (request.num_computed_tokens - live.in_flight) // BLOCK_SIZE > live.num_cached:
                    self._cache_blocks(live, request.num_computed_tokens - live.in_flight)
            if live.num_output >= live.spec.output_tokens:
                self._finish(live)
                finished = True
        if finished:
            self.running = [live for live in self.running if live.finished is None]
            if any(live.finished is not None for live in self.waiting):
                self.waiting = deque(live for live in self.waiting if live.finished is None)

    def _finish(self, live: Live) -> None:
        start = perf_counter()
        self.manager.free(live.request)
        self.bookkeeping += perf_counter() - start
        self.pool.release(live.blocks)
        live.blocks = []
        live.finished = self.clock
        self.finished_since_schedule = True
        self.counters.requests += 1
        if self.check and live.status == RUNNING and not all(live.served):
            missing = [i for i, served in enumerate(live.served) if not served]
            raise SimulationError(f"{live.spec.request_id} finished without items {missing} encoded or cached")
        self.arrivals.finished(live.spec, self.clock)


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
    host: HostTierModel | None = None,
) -> RunResult:
    """Replay ``workload`` (a generated ``Workload`` or a ``TraceWorkload``)
    through the scheduler with one manager variant.

    ``cache_size`` overrides the encoder cache size vLLM would derive;
    ``progress`` is called now and then with the number of finished requests;
    ``observer`` is told when each item occurrence is served (the oracle's first pass);
    ``host`` replaces the host-tier model the variant's ``host`` would build.
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
    if host is None and variant.host is not None:
        host = HostTierModel(variant.host)
    if host is not None and variant.policy == "oracle":
        raise ValueError("the oracle runs without a host tier")
    if host is not None and host.tier.num_blocks < max(workload.max_embeds_per_item().values()):
        raise ValueError(
            f"a host tier of {host.tier.num_blocks:,} blocks cannot hold the largest item "
            f"({max(workload.max_embeds_per_item().values()):,} embeddings): vLLM's host region refuses it"
        )
    if variant.policy == "oracle":
        recorder = oracle.Recorder()
        simulate(workload, limits, Variant(), cache_size=size, cost=cost, observer=recorder)
        future = oracle.Future(recorder)
        observer = future
    manager = variant.manager(size, future)
    run = _Run(
        _checked(workload.requests(), limits),
        limits,
        manager,
        compute_budget,
        cost,
        variant.lookahead,
        observer,
        check,
        progress,
        host,
    )
    start = perf_counter()
    run.run()
    wall = perf_counter() - start
    stats = manager.stats() if hasattr(manager, "stats") else None
    counters = None if host is None else host.counters
    return RunResult(variant, compute_budget, size, run.counters, run.bookkeeping, wall, stats, counters)


def steppable(
    arrivals: Any,
    limits: SchedulerLimits,
    manager: Any,
    budget: int,
    cost: EncoderCost,
    *,
    lookahead: bool,
    check: bool,
) -> _Run:
    """A run fed by ``arrivals`` (``Arrivals``' interface) that a driver advances with ``run(until)`` (``cluster.py``)."""
    run = _Run(iter(()), limits, manager, budget, cost, lookahead, None, check, None)
    run.arrivals = arrivals
    return run


def _checked(specs: Iterator[RequestSpec], limits: SchedulerLimits) -> Iterator[RequestSpec]:
    for spec in specs:
        if spec.total_tokens > limits.kv_tokens:
            raise ValueError(
                f"request {spec.request_id} needs {spec.total_tokens} tokens of KV cache, more than the "
                f"{limits.kv_tokens} kv_capacity={limits.kv_capacity} holds (in whole blocks, one kept out "
                "of the pool as vLLM does); raise the capacity or shrink the workload"
            )
        yield spec
