"""The scheduler model against vLLM 0.33's own scheduler (``--engine vllm``).

Every built-in workload, and a trace read back from a file, is replayed by
both engines at a roomy and a tight KV cache, with synchronous and async
scheduling; the counters must be identical field by field (encoded
embeddings, steps, preemptions, prefix-hit tokens, hits, evictions, ...).
The tight cache is sized from the workload's largest request so that it
preempts, and the test says so. Skipped unless vLLM 0.33 is importable;
run it with the environment docs/vllm.md describes.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

from encoder_cache.simulator import (  # noqa: E402
    SchedulerLimits,
    TraceWorkload,
    Variant,
    WorkloadConfig,
    generate,
    write_trace,
)
from encoder_cache.simulator.engine import simulate  # noqa: E402
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE  # noqa: E402
from encoder_cache.simulator.vllm_engine import simulate_vllm  # noqa: E402

pytestmark = pytest.mark.vllm

#: Small but busy: arrivals fast enough to queue, and (at the tight size) to preempt.
WORKLOADS = {
    "chat": WorkloadConfig(kind="chat", requests=40, arrival_rate=0.3, think_steps=5, seed=3),
    "video": WorkloadConfig(kind="video", requests=14, arrival_rate=0.05, frames=(8, 24), seed=3),
    "popular": WorkloadConfig(kind="popular", requests=60, arrival_rate=0.5, seed=3),
    "mix": WorkloadConfig(kind="mix", requests=40, arrival_rate=0.1, think_steps=20, seed=3),
}
LIMITS = SchedulerLimits(max_num_batched_tokens=2048)
ROOMY = 262144


def _tight(workload) -> int:
    """A KV cache a quarter larger than the largest request: requests queue and preempt."""
    largest = max(spec.total_tokens for spec in workload.requests())
    return (largest * 5 // 4 // BLOCK_SIZE + 2) * BLOCK_SIZE


def _compare(workload, limits, variant=None, cache_size=None):
    model = simulate(workload, limits, variant, cache_size=cache_size).counters
    real = simulate_vllm(workload, limits, variant, cache_size=cache_size).counters
    assert model.requests == real.requests == workload.num_requests
    assert model.as_dict() == real.as_dict()
    return model


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("kv", ["roomy", "tight"])
@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_model_counters_equal_vllms(kind, kv, scheduling):
    workload = generate(WORKLOADS[kind])
    limits = replace(
        LIMITS, kv_capacity=ROOMY if kv == "roomy" else _tight(workload), async_scheduling=scheduling == "async"
    )
    counters = _compare(workload, limits)
    assert counters.encoded_embeds > 0 and counters.evictions > 0, "the encoder cache must be under pressure"
    if kv == "tight":
        assert counters.preemptions > 0, "the tight KV cache must preempt for the comparison to mean anything"
    else:
        assert counters.preemptions == 0


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_admission_of_the_first_chunk_only(scheduling):
    """--no-scheduler-reserve-full-isl: admitted when the first chunk fits, preempted more."""
    workload = generate(WORKLOADS["popular"])
    limits = replace(
        LIMITS, kv_capacity=_tight(workload), reserve_full_isl=False, async_scheduling=scheduling == "async"
    )
    loose = _compare(workload, limits)
    whole = simulate(workload, replace(limits, reserve_full_isl=True)).counters
    assert loose.preemptions > whole.preemptions


@pytest.mark.parametrize("variant", [Variant("s3fifo", True), Variant("gdsf", False), Variant("vllm", True)])
def test_policies_and_lookahead_through_vllms_hooks(variant):
    workload = generate(WORKLOADS["popular"])
    limits = replace(LIMITS, kv_capacity=_tight(workload))
    _compare(workload, limits, variant, cache_size=4096)


def test_a_trace_read_back_from_a_file(tmp_path):
    path = tmp_path / "mix.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        write_trace(generate(WORKLOADS["mix"]).requests(), handle, 0.05)
    trace = TraceWorkload(str(path), 0.05)
    _compare(trace, replace(LIMITS, kv_capacity=_tight(trace)))


def test_prefix_caching_off():
    workload = generate(WORKLOADS["chat"])
    counters = _compare(workload, replace(LIMITS, prefix_caching=False, kv_capacity=_tight(workload)))
    assert counters.prefix_hit_tokens == counters.prefix_query_tokens == 0


def _templated_trace(path, seed: int = 5, lines: int = 70) -> None:
    """A deployment's traffic described by content: one system prompt for every
    request, popular images right after it, questions about a few videos
    (frames, then the question), and multi-turn sessions extending their
    previous turn."""
    rng = random.Random(seed)
    system = {"text": "system:v1", "tokens": 200}
    videos = [[{"id": f"v{v}-f{f}", "embeds": 96, "modality": "video"} for f in range(10)] for v in range(3)]
    with open(path, "w", encoding="utf-8") as handle:
        t = 0.0
        for n in range(lines):
            t += rng.expovariate(4.0)
            kind = rng.choice(("image", "video", "chat"))
            record = {"t": round(t, 3), "output_tokens": rng.randint(8, 120), "id": f"r{n}"}
            if kind == "image":
                image = rng.choice(range(8))
                record["prompt"] = [
                    system,
                    {"id": f"img{image}", "embeds": 64 * (1 + image)},
                    {"tokens": rng.randint(5, 60)},
                ]
            elif kind == "video":
                record["prompt"] = [system, *rng.choice(videos), {"tokens": rng.randint(5, 60)}]
            else:
                record["session"] = f"s{rng.randrange(6)}"
                record["prompt"] = [{"id": f"chat{n}", "embeds": 200}, {"tokens": rng.randint(5, 60)}]
            handle.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("kv", ["roomy", "tight"])
def test_a_trace_with_a_shared_template(tmp_path, kv, scheduling):
    path = tmp_path / "templated.jsonl"
    _templated_trace(path)
    trace = TraceWorkload(str(path), 0.05)
    limits = replace(
        LIMITS, kv_capacity=ROOMY if kv == "roomy" else _tight(trace), async_scheduling=scheduling == "async"
    )
    counters = _compare(trace, limits)
    assert counters.prefix_skipped_items > 0, "the template makes the prefix cache serve items across requests"
    if kv == "tight":
        assert counters.preemptions > 0
