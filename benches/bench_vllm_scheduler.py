"""vLLM 0.33's real scheduler on a multimodal workload: stock, with our
manager, with our scheduler subclass.

Each round builds a fresh scheduler and the workload's requests (untimed),
then runs the workload to the end with fake model outputs (timed:
``add_request`` + ``schedule()`` + the fake output + ``update_from_output()``).
``extra_info["us_per_step"]`` is the finer number: ``schedule()`` +
``update_from_output()`` alone, per step (use ``--benchmark-disable-gc`` to
keep collections out). ``python benches/bench_vllm_scheduler.py`` prints the
BENCHMARKS.md table: that number per variant, with the garbage collector off,
each step's fastest of several rounds, and the share of the three encoder-input
methods.
Skipped unless vLLM 0.33 is importable.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
}
ROUNDS = 5


@pytest.fixture(scope="module")
def model():
    with tempfile.TemporaryDirectory() as directory:
        yield harness.model_config(Path(directory))


def _prepare(variant, model, workload):
    setup, params = WORKLOADS[workload]
    specs = harness.conversations(**params)
    return harness.build_scheduler(variant, model, setup), specs


@pytest.mark.parametrize("variant", list(harness.VARIANTS))
@pytest.mark.parametrize("workload", list(WORKLOADS))
def bench_vllm_schedule_and_update(benchmark, model, workload, variant):
    benchmark.group = f"vLLM scheduler, {workload}"
    runs = []

    def one_run(scheduler, specs):
        runs.append(harness.run(scheduler, specs, record=False))

    benchmark.pedantic(one_run, setup=lambda: (_prepare(variant, model, workload), {}), rounds=ROUNDS)
    step_ns = [ns for run in runs for ns in run.step_ns]
    benchmark.extra_info["steps"] = len(runs[0].step_ns)
    benchmark.extra_info["us_per_step"] = statistics.fmean(step_ns) / 1e3
    assert all(len(run.step_ns) == len(runs[0].step_ns) for run in runs)


ENCODER_METHODS = ("_try_schedule_encoder_inputs", "_allocate_encoder_inputs", "_free_encoder_inputs")


def _time_encoder_methods(scheduler) -> list[int]:
    """Wrap the scheduler's three encoder-input methods (ours or vLLM's, which
    call the manager) with a timer; returns the list each call's time goes to."""
    spent: list[int] = []
    for name in ENCODER_METHODS:
        method = getattr(scheduler, name)

        def timed(*args, _method=method, **kwargs):
            begin = time.perf_counter_ns()
            try:
                return _method(*args, **kwargs)
            finally:
                spent.append(time.perf_counter_ns() - begin)

        setattr(scheduler, name, timed)
    return spent


def _count_embed_reads(variant, model, workload) -> int:
    """How many times the run asks vLLM's PlaceholderRange for its embed count
    (a torch cumsum the first time, for items with an ``is_embed`` mask)."""
    from vllm.multimodal.inputs import PlaceholderRange

    calls = 0
    original = PlaceholderRange.get_num_embeds

    def counted(self):
        nonlocal calls
        calls += 1
        return original(self)

    PlaceholderRange.get_num_embeds = counted
    try:
        harness.run(*_prepare(variant, model, workload), record=False)
    finally:
        PlaceholderRange.get_num_embeds = original
    return calls


def _run_without_gc(scheduler, specs) -> harness.Run:
    # As timeit does: a collection landing in one variant's run is noise, not its cost.
    gc.collect()
    gc.disable()
    try:
        return harness.run(scheduler, specs, record=False)
    finally:
        gc.enable()


def _best(rounds: list[list[int]], num_steps: int) -> float:
    """µs per step: each step's (or call's) fastest round, summed, over the steps.
    Every round makes the same calls in the same order, and the fastest is the
    one least disturbed by other load on the machine."""
    return sum(min(times) for times in zip(*rounds, strict=True)) / num_steps / 1e3


def report(rounds: int = ROUNDS) -> str:
    """The BENCHMARKS.md table: schedule() + update_from_output() per step, and
    the part of it spent in the three encoder-input methods."""
    with tempfile.TemporaryDirectory() as directory:
        model = harness.model_config(Path(directory))
        lines = [
            "| workload | steps | variant | schedule + update, µs/step | vs stock "
            "| encoder methods, µs/step | vs stock | get_num_embeds calls |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for workload in WORKLOADS:
            steps: dict[str, list[list[int]]] = {variant: [] for variant in harness.VARIANTS}
            encoder: dict[str, list[list[int]]] = {variant: [] for variant in harness.VARIANTS}
            # Interleave the variants round by round so drift hits all alike.
            for _ in range(rounds):
                for variant in harness.VARIANTS:
                    steps[variant].append(_run_without_gc(*_prepare(variant, model, workload)).step_ns)
                    scheduler, specs = _prepare(variant, model, workload)
                    spent = _time_encoder_methods(scheduler)
                    _run_without_gc(scheduler, specs)
                    encoder[variant].append(spent)
            num_steps = len(steps["stock"][0])
            step_us = {variant: _best(times, num_steps) for variant, times in steps.items()}
            encoder_us = {variant: _best(times, num_steps) for variant, times in encoder.items()}
            for variant in harness.VARIANTS:
                lines.append(
                    f"| {workload} | {num_steps} | {variant} | {step_us[variant]:.0f} | "
                    f"{step_us['stock'] / step_us[variant]:.2f}x | {encoder_us[variant]:.0f} | "
                    f"{encoder_us['stock'] / encoder_us[variant]:.2f}x | "
                    f"{_count_embed_reads(variant, model, workload)} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
