"""vLLM 0.33's real scheduler on multimodal workloads: stock, with our manager,
with our scheduler subclass, and the Amdahl ceiling.

The variants (``tests/vllm_harness.py`` builds them as vLLM's engine does):

- ``stock``: vLLM as shipped;
- ``manager``: ``ec_manager_config`` names ``encoder_cache.vllm.EncoderCacheManager``;
- ``scheduler``: ``scheduler_cls`` names ``encoder_cache.vllm.Scheduler``;
- ``ceiling``: stock with the three encoder-input methods
  (``_try_schedule_encoder_inputs``, ``_allocate_encoder_inputs``,
  ``_free_encoder_inputs``) made free: they return the results a stock run
  recorded, in order, and do nothing else. The scheduler then makes the same
  decisions, so its step is what any encoder-cache code could at best reach.

``python benches/bench_vllm_scheduler.py [--runs N] [--seed S] [workload ...]``
prints the BENCHMARKS.md table (``--seed`` draws every workload's traffic with
another seed). Per workload, each round runs every variant once
untimed inside (the whole step: ``schedule()`` + ``update_from_output()``,
fake model output excluded) and once with a timer around each encoder-input
method call (minus the timer's own cost, a timed empty method); the variants
are interleaved round by round and the garbage collector is off during a run.
Every round makes the same calls in the same order, so each step (and each
method call) is taken at its fastest round, the one least disturbed by other
load on the machine, and the mean over the steps is reported; ratios are of
those figures, all from the same run. With ``--runs N`` the whole measurement
is repeated N times and each cell is the median over the runs. "Extension
calls" counts calls into our compiled manager's methods per step (for stock:
calls into vLLM's manager). Under pytest (``make bench``) each variant's whole
run is timed by pytest-benchmark instead.
Skipped unless vLLM 0.33 is importable.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import vllm_harness as harness  # noqa: E402

pytestmark = pytest.mark.vllm

_IMAGE_SETS = harness.Setup(
    max_num_seqs=64,
    max_num_batched_tokens=8192,
    max_image_tokens=32,
    encoder_cache_size=4096,
    encoder_compute_budget=4096,
)
_IMAGE_SET_PROMPTS = dict(
    seed=7, num_images=512, image_lengths=(16, 24, 32), images_per_turn=(16, 48), max_tokens=(1, 4)
)
WORKLOADS = {
    # Chats over a shared image pool, one image per new turn; later turns hit the prefix cache.
    "chat-4-turns": (
        harness.Setup(
            max_num_seqs=64, max_num_batched_tokens=2048, encoder_cache_size=2048, encoder_compute_budget=2048
        ),
        dict(seed=7, num_conversations=48, num_turns=4, max_tokens=(8, 32)),
    ),
    # Photo sets or video frames: 16 to 48 small images per new turn, short answers.
    "image-sets-3-turns": (_IMAGE_SETS, dict(_IMAGE_SET_PROMPTS, num_conversations=32, num_turns=3)),
    "image-sets-1-turn": (_IMAGE_SETS, dict(_IMAGE_SET_PROMPTS, num_conversations=64, num_turns=1)),
    # Long answers: most steps decode 40-odd requests that are past their images.
    "decode-heavy": (
        harness.Setup(
            max_num_seqs=64,
            max_num_batched_tokens=2048,
            encoder_cache_size=2048,
            encoder_compute_budget=2048,
            num_blocks=4000,
        ),
        dict(seed=11, num_conversations=48, num_turns=1, images_per_turn=(1, 3), max_tokens=(96, 192), arrival_gap=1),
    ),
}
VARIANTS = [*harness.VARIANTS, "ceiling"]
ENCODER_METHODS = ("_try_schedule_encoder_inputs", "_allocate_encoder_inputs", "_free_encoder_inputs")
#: The methods of a manager a scheduler may call (per-call and step-level API).
MANAGER_METHODS = (
    "check_and_update_cache",
    "get_cached_num_encoder_embeds",
    "can_allocate",
    "allocate",
    "get_cached_input_ids",
    "free_encoder_input",
    "free",
    "get_freed_mm_hashes",
    "get_manager_metadata",
    "reset",
    "try_schedule_encoder_inputs",
    "allocate_encoder_inputs",
    "free_encoder_inputs_before",
)
ROUNDS = 7


@pytest.fixture(scope="module")
def model():
    with tempfile.TemporaryDirectory() as directory:
        yield harness.model_config(Path(directory))


def _prepare(variant: str, model, workload: str, replay: list | None = None):
    """A fresh scheduler for ``variant`` and the workload's specs; the ceiling
    needs the results a stock run recorded (see :func:`record_results`)."""
    setup, params = WORKLOADS[workload]
    specs = harness.conversations(**params)
    if variant != "ceiling":
        return harness.build_scheduler(variant, model, setup), specs
    scheduler = harness.build_scheduler("stock", model, setup)
    results = iter(replay)
    scheduler._try_schedule_encoder_inputs = lambda *args, **kwargs: next(results)
    scheduler._allocate_encoder_inputs = lambda *args: None
    scheduler._free_encoder_inputs = lambda request: None
    return scheduler, specs


def record_results(model, workload: str) -> list[tuple]:
    """What stock's ``_try_schedule_encoder_inputs`` returned, call by call."""
    scheduler, specs = _prepare("stock", model, workload)
    method = scheduler._try_schedule_encoder_inputs
    results: list[tuple] = []

    def recording(*args, **kwargs):
        result = method(*args, **kwargs)
        results.append(tuple(list(x) if isinstance(x, list) else x for x in result))
        return result

    scheduler._try_schedule_encoder_inputs = recording
    harness.run(scheduler, specs, record=False)
    return results


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def bench_vllm_schedule_and_update(benchmark, model, workload, variant):
    benchmark.group = f"vLLM scheduler, {workload}"
    replay = record_results(model, workload) if variant == "ceiling" else None
    runs = []

    def one_run(scheduler, specs):
        runs.append(harness.run(scheduler, specs, record=False))

    benchmark.pedantic(one_run, setup=lambda: (_prepare(variant, model, workload, replay), {}), rounds=3)
    step_ns = [ns for run in runs for ns in run.step_ns]
    benchmark.extra_info["steps"] = len(runs[0].step_ns)
    benchmark.extra_info["us_per_step"] = statistics.fmean(step_ns) / 1e3
    # Every variant, the ceiling included, makes the same steps as stock.
    stock_steps = len(harness.run(*_prepare("stock", model, workload), record=False).step_ns)
    assert all(len(run.step_ns) == stock_steps for run in runs)


# --- the report ---------------------------------------------------------------


def _timed(method: Callable, spent: list[int]) -> Callable:
    def timed(*args, **kwargs):
        begin = time.perf_counter_ns()
        try:
            return method(*args, **kwargs)
        finally:
            spent.append(time.perf_counter_ns() - begin)

    return timed


def _time_encoder_methods(scheduler) -> list[int]:
    """Wrap the scheduler's three encoder-input methods with a timer; returns
    the list each call's time goes to."""
    spent: list[int] = []
    for name in ENCODER_METHODS:
        setattr(scheduler, name, _timed(getattr(scheduler, name), spent))
    return spent


def timer_cost(calls: int = 20_000, rounds: int = ROUNDS) -> float:
    """ns the timer adds to one call: a timed empty method, taken as the
    encoder methods are: each call at its fastest of ``rounds`` rounds, the
    mean over the calls."""

    class Empty:
        def method(self, request, *args, **kwargs):
            return None

    per_round: list[list[int]] = []
    for _ in range(rounds):
        spent: list[int] = []
        timed = _timed(Empty().method, spent)
        for _ in range(calls):
            timed(None, 0, 0, 0, shift_computed_tokens=0)
        per_round.append(spent)
    return statistics.fmean(min(times) for times in zip(*per_round, strict=True))


def _without_gc(scheduler, specs) -> harness.Run:
    # As timeit does: a collection landing in one variant's run is noise, not its cost.
    gc.collect()
    gc.disable()
    try:
        return harness.run(scheduler, specs, record=False)
    finally:
        gc.enable()


def count_manager_calls(variant: str, model, workload: str) -> tuple[float, int]:
    """(manager method calls per step, steps): into our extension for the
    ``manager`` and ``scheduler`` variants, into vLLM's manager for stock."""
    if variant == "stock":
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager as cls
    else:
        from encoder_cache.vllm import EncoderCacheManager as cls
    calls = 0
    patched: dict[str, Any] = {}

    def counting(name: str) -> Callable:
        original = getattr(cls, name)

        def counted(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            return original(self, *args, **kwargs)

        return counted

    for name in MANAGER_METHODS:
        if hasattr(cls, name):
            patched[name] = cls.__dict__.get(name)
            setattr(cls, name, counting(name))
    try:
        run = harness.run(*_prepare(variant, model, workload), record=False)
    finally:
        for name, value in patched.items():
            if value is None:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
    return calls / len(run.step_ns), len(run.step_ns)


def _per_unit(rounds: list[list[int]], num_steps: int) -> float:
    """µs per step: each step's (or call's) fastest round, summed, over the steps."""
    return sum(min(times) for times in zip(*rounds, strict=True)) / num_steps / 1e3


def measure(model, workload: str, rounds: int, overhead: float) -> dict[str, dict[str, Any]]:
    """Per variant: µs per step of the whole step and of the encoder methods,
    calls of those methods and into the manager per step."""
    replay = record_results(model, workload)
    steps: dict[str, list[list[int]]] = {v: [] for v in VARIANTS}
    encoder: dict[str, list[list[float]]] = {v: [] for v in VARIANTS if v != "ceiling"}
    for _ in range(rounds):
        # Interleave the variants round by round so drift hits all alike.
        for variant in VARIANTS:
            steps[variant].append(_without_gc(*_prepare(variant, model, workload, replay)).step_ns)
            if variant == "ceiling":
                continue
            scheduler, specs = _prepare(variant, model, workload)
            spent = _time_encoder_methods(scheduler)
            _without_gc(scheduler, specs)
            encoder[variant].append([ns - overhead for ns in spent])
    num_steps = len(steps["stock"][0])
    found: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        found[variant] = {"step": _per_unit(steps[variant], num_steps)}
        if variant != "ceiling":
            found[variant]["encoder"] = _per_unit(encoder[variant], num_steps)
            found[variant]["method_calls"] = len(encoder[variant][0]) / num_steps
            found[variant]["calls"], _ = count_manager_calls(variant, model, workload)
    found["stock"]["steps"] = num_steps
    return found


def _median(found: list[dict], variant: str, key: str, over: str | None = None) -> float:
    """Median over runs of a figure, or of ``over``'s figure divided by it (a ratio)."""
    if over is None:
        return statistics.median(f[variant][key] for f in found)
    return statistics.median(f[over][key] / f[variant][key] for f in found)


def report(rounds: int = ROUNDS, workloads: list[str] | None = None, runs: int = 1) -> str:
    """The BENCHMARKS.md table; with ``runs`` > 1, each cell is the median over runs."""
    overhead = timer_cost()
    lines = [
        "| workload | steps | variant | step, µs | vs stock | ceiling vs stock | encoder methods, µs/step "
        "| vs stock | method calls/step | extension calls/step |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as directory:
        model = harness.model_config(Path(directory))
        for workload in workloads or WORKLOADS:
            found = [measure(model, workload, rounds, overhead) for _ in range(runs)]

            ceiling = _median(found, "ceiling", "step", over="stock")
            for variant in VARIANTS:
                row = found[0][variant]
                cells = [workload, str(found[0]["stock"]["steps"]), variant, f"{_median(found, variant, 'step'):.0f}"]
                cells += [f"{_median(found, variant, 'step', over='stock'):.2f}x", f"{ceiling:.2f}x"]
                if variant == "ceiling":
                    cells += ["0", "", "", ""]
                else:
                    calls = f"{row['calls']:.1f}"
                    encoder = _median(found, variant, "encoder")
                    # At or below zero the methods cost less than the timer's noise: no ratio to give.
                    ratio = f"{_median(found, variant, 'encoder', over='stock'):.2f}x" if encoder > 0 else "n/a"
                    cells += [
                        f"{encoder:.1f}",
                        ratio,
                        f"{row['method_calls']:.1f}",
                        f"({calls} into vLLM's)" if variant == "stock" else calls,
                    ]
                lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Timer cost removed from each encoder-method call: {overhead:.0f} ns; {runs} run(s) of {rounds} rounds."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="vLLM 0.33's real scheduler: the BENCHMARKS.md table")
    parser.add_argument("--runs", type=int, default=1, help="repeat the measurement; cells are medians over runs")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per run (default %(default)s)")
    parser.add_argument(
        "--seed", type=int, help="draw every workload's traffic with this seed instead of its own (unseen traffic)"
    )
    parser.add_argument("workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)")
    args = parser.parse_args()
    if args.seed is not None:
        for _, params in WORKLOADS.values():
            params["seed"] = args.seed
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    print(report(args.rounds, args.workloads or None, args.runs))
