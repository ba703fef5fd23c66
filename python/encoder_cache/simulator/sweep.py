"""Which runs one invocation makes, and running them (in parallel processes
when asked): the headline variants at vLLM's default capacity, an unbounded
cache, and a sweep of encoder-cache sizes, extended until a size comes within
reach of unbounded. Every run goes through an *engine*: a function with
``engine.simulate``'s signature (the built-in model by default)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.engine import simulate
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.options import DEFAULT_SIZES, MAX_EXTRA_SIZES
from encoder_cache.simulator.progress import Progress
from encoder_cache.simulator.report import Report
from encoder_cache.simulator.results import RunResult
from encoder_cache.simulator.variants import UNBOUNDED, Variant

__all__ = ["Engine", "Runner", "fill", "planned_runs"]

#: ``engine(workload, limits, variant, *, cache_size, cost, check, progress) -> RunResult``
Engine = Callable[..., RunResult]
#: One run: a variant, a cache size (None: vLLM's default), and limits other than the runner's.
Job = tuple[Variant, int | None] | tuple[Variant, int | None, SchedulerLimits]


#: In a worker process: the requests its runs in progress have finished, shared with the parent.
_finished: Any = None
#: In a worker process: the parent's pid. A worker whose parent is gone (killed
#: without the chance to stop its workers) stops at its next progress report.
_parent: int | None = None


def _start_worker(finished: Any) -> None:
    """Workers leave Ctrl-C to the parent, which stops them, and report progress through ``finished``."""
    global _finished, _parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _finished = finished
    _parent = os.getppid()


def _one(job: tuple[Engine, Any, SchedulerLimits, Variant, int | None, EncoderCost, bool]) -> tuple[RunResult, int]:
    """The run's result, and how many of its finished requests it added to the shared count."""
    engine, workload, limits, variant, size, cost, check = job
    reported = 0

    def progress(done: int) -> None:
        nonlocal reported
        if _parent is not None and os.getppid() != _parent:
            os._exit(1)  # orphaned: no one waits for this run's result
        if _finished is not None:
            with _finished.get_lock():
                _finished.value += done - reported
            reported = done

    result = engine(workload, limits, variant, cache_size=size, cost=cost, check=check, progress=progress)
    return result, reported


class Runner:
    """Runs jobs of one workload, each once (results are kept): in this
    process, or in ``jobs`` worker processes that a Ctrl-C stops at once."""

    def __init__(
        self,
        workload: Any,
        limits: SchedulerLimits,
        cost: EncoderCost,
        check: bool,
        jobs: int,
        bar: Progress | None,
        engine: Engine = simulate,
    ) -> None:
        self.workload, self.limits, self.cost, self.check = workload, limits, cost, check
        self.jobs, self.bar, self.engine = jobs, bar, engine
        self.done: dict[tuple[Variant, int | None, SchedulerLimits], RunResult] = {}

    def _key(self, job: Job) -> tuple[Variant, int | None, SchedulerLimits]:
        return (job[0], job[1], job[2] if len(job) == 3 else self.limits)  # type: ignore[misc]

    def run(self, wanted: list[Job]) -> list[RunResult]:
        keys = [self._key(job) for job in wanted]
        todo = [k for k in dict.fromkeys(keys) if k not in self.done]
        if self.bar is not None:
            self.bar.label = f"{len(todo)} runs"
        if self.jobs <= 1 or len(todo) <= 1:
            for variant, size, limits in todo:
                if self.bar is not None:
                    self.bar.label = variant.name
                progress = None if self.bar is None else self.bar.update
                self.done[(variant, size, limits)] = self.engine(
                    self.workload,
                    limits,
                    variant,
                    cache_size=size,
                    cost=self.cost,
                    check=self.check,
                    progress=progress,
                )
                self._advance()
        else:
            self._parallel(todo)
        return [self.done[k] for k in keys]

    def _parallel(self, todo: list[tuple[Variant, int | None, SchedulerLimits]]) -> None:
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        finished = context.Value("q", 0)
        pool = context.Pool(min(self.jobs, len(todo)), initializer=_start_worker, initargs=(finished,))
        try:
            pending = {
                key: pool.apply_async(
                    _one, ((self.engine, self.workload, key[2], key[0], key[1], self.cost, self.check),)
                )
                for key in todo
            }
            while pending:
                for key in [k for k, result in pending.items() if result.ready()]:
                    self.done[key], reported = pending.pop(key).get()
                    with finished.get_lock():  # the run now counts whole, in the bar's own total
                        finished.value -= reported
                    self._advance()
                if pending:
                    time.sleep(0.05)
                    if self.bar is not None:
                        self.bar.update(finished.value)
            pool.close()
        except BaseException:
            pool.terminate()  # Ctrl-C or a failed run: stop the other runs now
            raise
        finally:
            pool.join()

    def new_runs(self, wanted: list[Job]) -> int:
        """How many of ``wanted`` have not run yet."""
        return len({k for k in map(self._key, wanted) if k not in self.done})

    def grow(self, runs: int) -> None:
        """``runs`` more runs than planned: the progress bar's total grows."""
        if self.bar is not None:
            self.bar.total += runs * self.workload.num_requests

    def _advance(self) -> None:
        if self.bar is not None:
            self.bar.done += self.workload.num_requests
            self.bar.update(0)


def planned_runs(num_variants: int, num_sizes: int, sweep: bool, explicit: bool) -> int:
    """How many runs ``fill`` starts with (it may add a few)."""
    if not sweep:
        return num_variants
    return num_variants + 2 + 2 * len(DEFAULT_SIZES) + (num_variants * num_sizes if explicit else 0)


def fill(
    report: Report,
    runner: Runner,
    variants: list[Variant],
    sizes: list[int | None],
    sweep: bool,
    explicit: bool,
) -> None:
    """Run what the report shows: every variant at the default capacity; with
    ``sweep``, an unbounded cache, ``vllm`` without prefix caching, and the
    recommendation's search; with ``explicit``, ``sizes`` (None: the default
    capacity) for every variant, for the table.

    The search tries vLLM's default size and ``DEFAULT_SIZES`` for vllm and
    the best policy, then 4x larger while no size is within reach, then one
    size between the last too small and the first within reach: the same
    runs whatever ``sizes`` asks, so the recommendation does not depend on them."""
    default = report.default_size
    extra: list[Job] = [(Variant(), UNBOUNDED)] if sweep else []
    if sweep and runner.limits.prefix_caching:
        extra.append((Variant(), None, replace(runner.limits, prefix_caching=False)))
    runs = runner.run([(v, None) for v in variants] + extra)
    report.headline = runs[: len(variants)]
    if not sweep:
        return
    report.unbounded = runs[len(variants)]
    if runner.limits.prefix_caching:
        report.no_prefix = runs[-1]
    best = report.best()
    chosen = list(dict.fromkeys(r.variant for r in (report.baseline(report.headline), best) if r is not None))
    report.search = runner.run([(v, None if s == default else s) for s in DEFAULT_SIZES for v in chosen])
    # Not within reach yet: go on by 4x while a larger cache could still hold more.
    largest = DEFAULT_SIZES[-1]
    needed = report.unbounded.counters.distinct_embeds
    for _ in range(MAX_EXTRA_SIZES):
        rec = report.recommendation()
        if rec is None or rec["found"] or largest >= needed:
            break
        largest *= 4
        runner.grow(len(chosen))
        report.search += runner.run([(v, largest) for v in chosen])
    # One finer size between the last one too small and the first one within reach.
    rec = report.recommendation()
    known = sorted({r.encoder_cache_size for r in report.candidates()})
    if rec is not None and rec["found"] and known.index(rec["size"]) > 0:
        below = known[known.index(rec["size"]) - 1]
        middle = round((below * rec["size"]) ** 0.5 / 1024) * 1024
        if below < middle < rec["size"]:
            runner.grow(len(chosen))
            report.search += runner.run([(v, middle) for v in chosen])
    if explicit:
        report.sweep = runner.run([(v, s) for s in sizes for v in variants])
    else:
        report.sweep = list(report.search)
