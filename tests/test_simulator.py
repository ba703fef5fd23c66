"""The simulator's workloads and scheduler: determinism, conservation, and the
differences between manager variants it exists to show."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from encoder_cache import reference
from encoder_cache.simulator import SchedulerLimits, SimulationError, WorkloadConfig, generate, simulate
from encoder_cache.simulator.scheduler import MANAGERS

SMALL = {
    "chat": WorkloadConfig(kind="chat", requests=40, seed=3),
    "video": WorkloadConfig(kind="video", requests=12, frames=(20, 60), arrival_rate=0.5, seed=4),
    "popular": WorkloadConfig(kind="popular", requests=60, arrival_rate=0.5, seed=5),
    "mix": WorkloadConfig(kind="mix", requests=40, frames=(20, 60), arrival_rate=0.2, seed=6),
}
LIMITS = SchedulerLimits()
VARIANTS = sorted(MANAGERS)


# Workloads


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_same_config_same_workload(kind):
    config = SMALL[kind]
    assert generate(config) == generate(config)
    assert generate(config) != generate(replace(config, seed=config.seed + 1))


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_workload_shape(kind):
    workload = generate(SMALL[kind])
    specs = list(workload.requests)
    assert len(specs) == workload.num_requests == SMALL[kind].requests
    assert len({s.request_id for s in specs}) == len(specs)
    arrivals = [s.arrival for s in workload.sessions]
    assert arrivals == sorted(arrivals)
    for spec in specs:
        assert spec.items, "every generated request has multimodal items"
        ends = [0] + [i.offset + i.length for i in spec.items]
        starts = [i.offset for i in spec.items] + [spec.prompt_tokens]
        assert all(end < start for end, start in zip(ends, starts)), "items are sorted, apart, inside the prompt"
    for session in workload.sessions:
        assert len(session.think) == len(session.requests) - 1


def test_chat_turns_resend_their_history():
    config = WorkloadConfig(kind="chat", requests=60, repeat_prob=1.0, seed=1)
    sessions = [s for s in generate(config).sessions if len(s.requests) > 1]
    assert sessions
    repeats = 0
    for session in sessions:
        for earlier, later in zip(session.requests, session.requests[1:]):
            earlier_ids = [i.identifier for i in earlier.items]
            later_ids = [i.identifier for i in later.items]
            # The whole previous request (prompt and answer) is the prefix of the next one.
            assert later_ids[: len(earlier_ids)] == earlier_ids
            assert later.items[len(earlier_ids)].offset > earlier.total_tokens
            repeats += any(n > 1 for n in Counter(later_ids).values())
    assert repeats, "with repeat_prob=1 some requests hold an image at several positions"


def test_video_and_popular_items():
    video = generate(SMALL["video"])
    for spec in video.requests:
        assert 20 <= len(spec.items) <= 60
        assert len({i.length for i in spec.items}) == 1 and 64 <= spec.items[0].length <= 256
        assert {i.modality for i in spec.items} == {"video"}
    popular = generate(SMALL["popular"])
    counts = Counter(i.identifier for s in popular.requests for i in s.items)
    assert len(counts) <= SMALL["popular"].catalogue
    assert counts.most_common(1)[0][1] > 5, "Zipf: the top image comes back again and again"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "audio"}, "unknown workload"),
        ({"requests": 0}, "requests must be > 0"),
        ({"image_embeds": (10, 5)}, "image_embeds must be a range"),
        ({"repeat_prob": 1.5}, "repeat_prob"),
        ({"popular_images": (1, 50)}, "exceeds the catalogue"),
        ({"mix": (0.0, 0.0, 0.0)}, "mix needs"),
        ({"arrival_rate": 0.0}, "arrival_rate must be > 0"),
        ({"think_steps": -1.0}, "think_steps must be >= 0"),
    ],
)
def test_bad_workload_config(changes, message):
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**changes)


def test_bad_limits():
    with pytest.raises(ValueError, match="max_num_seqs must be > 0"):
        SchedulerLimits(max_num_seqs=0)
    with pytest.raises(ValueError, match="needs .* tokens of KV cache"):
        simulate(generate(SMALL["chat"]), SchedulerLimits(kv_capacity=1000), "python", "fixed")
    with pytest.raises(ValueError, match="no manager rust-prefix"):
        simulate(generate(SMALL["chat"]), LIMITS, "rust", "prefix")


# The scheduler


@pytest.mark.parametrize("variant", VARIANTS, ids="-".join)
@pytest.mark.parametrize("kind", sorted(SMALL))
def test_conservation_checked_every_step(kind, variant):
    """check=True: every scheduled item is encoded or in the cache, the cache's
    sizes add up after every step, no reference outlives its request."""
    workload = generate(SMALL[kind])
    result = simulate(workload, LIMITS, *variant, check=True)
    c = result.counters
    assert c.requests == workload.num_requests
    assert c.steps == len(result.evicted_in_use_by_step)
    assert result.evicted_in_use_by_step[-1] == c.evicted_in_use_embeds
    assert c.recomputed_embeds <= c.encoded_embeds
    if variant[1] != "prefix":
        assert c.evicted_in_use_embeds == 0, "a held item is never evicted"
    if c.preemptions == 0 and c.evicted_in_use_embeds == 0:
        items = sum(len(s.items) for s in workload.requests)
        assert c.encoded_items + c.cache_hits == items, "each item encoded or served from cache, once"


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_same_seed_same_counters(kind):
    workload = generate(SMALL[kind])
    first = simulate(workload, LIMITS, "python", "prefix")
    again = simulate(generate(SMALL[kind]), LIMITS, "python", "prefix")
    assert first.counters == again.counters
    assert first.evicted_in_use_by_step == again.evicted_in_use_by_step


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_fixed_variants_decide_alike(kind):
    """Rust, pure Python and the PR's scan implement one behaviour: same decisions, same counters."""
    workload = generate(SMALL[kind])
    counters = [
        simulate(workload, LIMITS, i, b).counters
        for i, b in [("rust", "fixed"), ("python", "fixed"), ("python", "scan")]
    ]
    assert counters[0] == counters[1] == counters[2]


def test_prefix_recomputes_items_still_in_use():
    """The seed scenario: chat turns holding an image twice, a small encoder cache."""
    workload = generate(WorkloadConfig(kind="chat", requests=300, repeat_prob=1.0, seed=0))
    fixed = simulate(workload, LIMITS, "python", "fixed").counters
    prefix = simulate(workload, LIMITS, "python", "prefix").counters
    assert fixed.evicted_in_use_embeds == 0
    assert prefix.evicted_in_use_embeds > 0
    assert prefix.recomputed_embeds >= prefix.evicted_in_use_embeds


def test_kv_pressure_preempts_and_recomputes():
    workload = generate(replace(SMALL["chat"], arrival_rate=2.0))
    largest = max(s.total_tokens for s in workload.requests)
    result = simulate(workload, SchedulerLimits(kv_capacity=largest), "rust", "fixed", check=True)
    assert result.counters.preemptions > 0
    assert result.counters.requests == workload.num_requests


def test_progress_reports_finished_requests():
    seen = []
    simulate(generate(SMALL["popular"]), LIMITS, "python", "fixed", progress=seen.append)
    assert seen[-1] == SMALL["popular"].requests
    assert seen == sorted(seen)


class _LeakyManager(reference.EncoderCacheManager):
    """Never drops a reference."""

    def free_encoder_input(self, request, input_id):
        pass


class _LyingManager(reference.EncoderCacheManager):
    """Reports a cache hit for every item, cached or not."""

    def check_and_update_cache(self, request, input_id):
        return True


@pytest.mark.parametrize(
    ("manager", "message"),
    [(_LeakyManager, "still hold entries"), (_LyingManager, "neither encoded nor in the cache")],
)
def test_checks_catch_a_broken_manager(monkeypatch, manager, message):
    monkeypatch.setitem(MANAGERS, ("python", "broken"), manager)
    with pytest.raises(SimulationError, match=message):
        simulate(generate(SMALL["popular"]), LIMITS, "python", "broken", check=True)
