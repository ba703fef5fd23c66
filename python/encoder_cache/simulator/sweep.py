"""Which runs one invocation makes, and running them (in parallel processes
when asked): the headline variants at vLLM's default capacity, an unbounded
cache, and a sweep of encoder-cache sizes, extended until a size comes within
reach of unbounded. Every run goes through an *engine*: a function with
``engine.simulate``'s signature (the built-in model by default)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
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


def _one(job: tuple[Engine, Any, SchedulerLimits, Variant, int | None, EncoderCost, bool]) -> RunResult:
    engine, workload, limits, variant, size, cost, check = job
    return engine(workload, limits, variant, cache_size=size, cost=cost, check=check)


class Runner:
    """Runs ``(variant, cache size)`` pairs of one workload, each once (results are kept)."""

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
        self.done: dict[tuple[Variant, int | None], RunResult] = {}

    def run(self, wanted: list[tuple[Variant, int | None]]) -> list[RunResult]:
        todo = [w for w in dict.fromkeys(wanted) if w not in self.done]
        if self.bar is not None:
            self.bar.label = f"{len(todo)} runs"
        if self.jobs <= 1 or len(todo) <= 1:
            for variant, size in todo:
                if self.bar is not None:
                    self.bar.label = variant.name
                progress = None if self.bar is None else self.bar.update
                self.done[(variant, size)] = self.engine(
                    self.workload,
                    self.limits,
                    variant,
                    cache_size=size,
                    cost=self.cost,
                    check=self.check,
                    progress=progress,
                )
                self._advance()
        else:
            context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            with ProcessPoolExecutor(max_workers=min(self.jobs, len(todo)), mp_context=context) as pool:
                futures = {
                    pool.submit(_one, (self.engine, self.workload, self.limits, v, s, self.cost, self.check)): (v, s)
                    for v, s in todo
                }
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for future in finished:
                        self.done[futures[future]] = future.result()
                        self._advance()
                    if self.bar is not None:
                        self.bar.update(0)
        return [self.done[w] for w in wanted]

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
    return num_variants + (num_variants * num_sizes if explicit else 2 * num_sizes) + 1


def fill(
    report: Report,
    runner: Runner,
    variants: list[Variant],
    sizes: list[int | None],
    sweep: bool,
    explicit: bool,
) -> None:
    """Run what the report shows. ``sizes`` (None: the default capacity) are
    swept for every variant when ``explicit``; otherwise for vllm and the best
    policy, then 4x larger while no size is within reach, then one size
    between the last too small and the first within reach."""
    if sweep and explicit:
        wanted = [(v, None) for v in variants] + [(v, s) for s in sizes for v in variants]
        wanted.append((Variant(), UNBOUNDED))
        runs = runner.run(wanted)
        report.headline = runs[: len(variants)]
        report.sweep = runs[len(variants) : -1]
        report.unbounded = runs[-1]
        return
    extra = [(Variant(), UNBOUNDED)] if sweep else []
    runs = runner.run([(v, None) for v in variants] + extra)
    report.headline = runs[: len(variants)]
    if not sweep:
        return
    report.unbounded = runs[-1]
    best = report.best()
    chosen = list(dict.fromkeys(r.variant for r in (report.baseline(report.headline), best) if r is not None))
    report.sweep = runner.run([(v, s) for s in sizes for v in chosen])
    # Not within reach yet: go on by 4x while a larger cache could still hold more.
    largest = DEFAULT_SIZES[-1]
    needed = report.unbounded.counters.distinct_embeds
    for _ in range(MAX_EXTRA_SIZES):
        rec = report.recommendation()
        if rec is None or rec["found"] or largest >= needed:
            break
        largest *= 4
        runner.grow(len(chosen))
        report.sweep += runner.run([(v, largest) for v in chosen])
    # One finer size between the last one too small and the first one within reach.
    rec = report.recommendation()
    known = report.sizes()
    if rec is not None and rec["found"] and known.index(rec["size"]) > 0:
        below = known[known.index(rec["size"]) - 1]
        middle = round((below * rec["size"]) ** 0.5 / 1024) * 1024
        if below < middle < rec["size"]:
            runner.grow(len(chosen))
            report.sweep += runner.run([(v, middle) for v in chosen])
