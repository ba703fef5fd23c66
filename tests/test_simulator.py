"""The simulator's workloads and scheduler: determinism, conservation, and the
differences between manager variants it exists to show."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest

from encoder_cache import reference
from encoder_cache.simulator import (
    UNBOUNDED,
    SchedulerLimits,
    SimulationError,
    Variant,
    WorkloadConfig,
    available_policies,
    generate,
    simulate,
)
from encoder_cache.simulator import oracle as oracle_module
from encoder_cache.simulator import variants as variants_module
from encoder_cache.simulator.prompts import shared_prefix
from encoder_cache.simulator.variants import supports_lookahead
from encoder_cache.simulator.workloads import Item, RequestSpec

SMALL = {
    "chat": WorkloadConfig(kind="chat", requests=40, think_steps=5.0, seed=3),
    "video": WorkloadConfig(kind="video", requests=12, frames=(10, 30), arrival_rate=0.2, video_catalogue=4, seed=4),
    "popular": WorkloadConfig(kind="popular", requests=60, catalogue=40, seed=5),
    "mix": WorkloadConfig(kind="mix", requests=40, frames=(10, 30), arrival_rate=0.2, think_steps=5.0, seed=6),
}
#: A small encoder cache, so that eviction policies matter on the small workloads.
LIMITS = SchedulerLimits(max_num_batched_tokens=2048)
VARIANTS = [
    Variant("vllm", False, "rust"),
    *[
        Variant(p, la, "rust")
        for p in available_policies("rust")
        for la in ((False, True) if supports_lookahead("rust") else (False,))
        if (p, la) != ("vllm", False)
    ],
    # The twin's policies decide as Rust's do (test_implementations_decide_alike); one of them here.
    Variant(available_policies("python")[-1], True, "python"),
    *([Variant("oracle", False, "python")] if oracle_module.AVAILABLE else []),
]


# Workloads


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_same_config_same_workload(kind):
    config = SMALL[kind]
    assert generate(config) == generate(config)
    assert generate(config) != generate(replace(config, seed=config.seed + 1))


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_workload_shape(kind):
    workload = generate(SMALL[kind])
    specs = list(workload.requests())
    assert len(specs) == workload.num_requests == SMALL[kind].requests
    assert len({s.request_id for s in specs}) == len(specs)
    arrivals = [s.arrival for s in specs]
    assert arrivals == sorted(arrivals)
    for spec in specs:
        assert spec.items, "every generated request has multimodal items"
        ends = [0] + [i.offset + i.length for i in spec.items]
        starts = [i.offset for i in spec.items] + [spec.prompt_tokens]
        assert all(end < start for end, start in zip(ends, starts)), "items are sorted, apart, inside the prompt"
        assert (spec.think is not None) == (spec.session is not None and not spec.request_id.endswith("turn0"))


def test_chat_turns_resend_their_history():
    config = WorkloadConfig(kind="chat", requests=60, repeat_prob=1.0, seed=1)
    by_session: dict[str, list[RequestSpec]] = {}
    for spec in generate(config).requests():
        by_session.setdefault(spec.session, []).append(spec)
    sessions = [turns for turns in by_session.values() if len(turns) > 1]
    assert sessions
    repeats = 0
    for turns in sessions:
        for earlier, later in itertools.pairwise(turns):
            assert later.arrival > earlier.arrival
            earlier_ids = [i.identifier for i in earlier.items]
            later_ids = [i.identifier for i in later.items]
            # The whole previous request (prompt and answer) is the prefix of the next one.
            assert later.items[: len(earlier.items)] == earlier.items
            assert later.items[len(earlier_ids)].offset > earlier.total_tokens
            assert shared_prefix(earlier, later) == earlier.total_tokens
            repeats += any(n > 1 for n in Counter(later_ids).values())
    assert repeats, "with repeat_prob=1 some requests hold an image at several positions"


def test_video_and_popular_items():
    video = generate(SMALL["video"])
    for spec in video.requests():
        assert 10 <= len(spec.items) <= 30
        assert len({i.length for i in spec.items}) == 1 and 64 <= spec.items[0].length <= 256
        assert {i.modality for i in spec.items} == {"video"}
    videos = Counter(spec.items[0].identifier.split("-")[0] for spec in video.requests())
    assert len(videos) <= 4 and videos.most_common(1)[0][1] > 1, "videos come back by popularity"
    popular = generate(WorkloadConfig(kind="popular", requests=400, seed=2))
    counts = Counter(i.identifier for s in popular.requests() for i in s.items)
    sizes = {i.identifier: i.length for s in popular.requests() for i in s.items}
    assert counts.most_common(1)[0][1] > 20, "Zipf: the top image comes back again and again"
    assert min(sizes.values()) < 128 and max(sizes.values()) > 1500, "thumbnails to multi-tile images"
    per_request = Counter(len(s.items) for s in popular.requests())
    assert per_request[1] > per_request[2] > per_request[3] > 0, "images per request: heavy-tailed"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "audio"}, "unknown workload"),
        ({"requests": 0}, "requests must be > 0"),
        ({"image_embeds": (10, 5)}, "image_embeds must be a range"),
        ({"repeat_prob": 1.5}, "repeat_prob"),
        ({"popular_images": (1, 50), "catalogue": 20}, "exceeds the catalogue"),
        ({"mix": (0.0, 0.0, 0.0)}, "mix needs"),
        ({"arrival_rate": 0.0}, "arrival_rate must be > 0"),
        ({"think_steps": -1.0}, "think_steps must be >= 0"),
        ({"zipf": float("nan")}, "zipf must be a finite number"),
        ({"zipf": float("inf")}, "zipf must be a finite number"),
    ],
)
def test_bad_workload_config(changes, message):
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**changes)


def test_bad_limits():
    with pytest.raises(ValueError, match="max_num_seqs must be > 0"):
        SchedulerLimits(max_num_seqs=0)
    with pytest.raises(ValueError, match="needs .* tokens of KV cache"):
        simulate(generate(SMALL["chat"]), SchedulerLimits(kv_capacity=1000))
    with pytest.raises(ValueError, match="exists only in python"):
        simulate(generate(SMALL["chat"]), LIMITS, Variant("vllm", False, "rust", "prefix"))
    with pytest.raises(ValueError, match="no policy 'nope'"):
        simulate(generate(SMALL["chat"]), LIMITS, Variant("nope", False, "python"))


# The scheduler


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v.implementation}-{v.name}")
@pytest.mark.parametrize("kind", sorted(SMALL))
def test_conservation_checked_every_step(kind, variant):
    """check=True: every scheduled item is encoded or in the cache, the cache's
    invariants hold and its sizes add up after every step, no reference or KV
    block outlives its request."""
    workload = generate(SMALL[kind])
    result = simulate(workload, LIMITS, variant, check=True)
    c = result.counters
    assert c.requests == workload.num_requests
    assert c.recomputed_embeds <= c.encoded_embeds
    assert c.evicted_in_use_embeds == 0, "a held item is never evicted"
    assert c.distinct_embeds <= c.encoded_embeds + c.prefix_skipped_embeds
    if c.preemptions == 0:
        items = sum(len(s.items) for s in workload.requests())
        assert c.encoded_items + c.cache_hits + c.prefix_skipped_items == items, "each item served once"
    if result.manager_stats is not None:
        # The manager's own counters agree with what the scheduler saw.
        stats = result.manager_stats
        assert (stats["misses"], stats["miss_embeds"]) == (c.encoded_items, c.encoded_embeds)
        assert stats["reencode_embeds"] == c.recomputed_embeds
        assert stats["evictions"] >= c.evictions  # freed lists omit entries evicted and re-cached in one step


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_same_seed_same_counters(kind):
    variant = Variant("vllm", True, "python") if "vllm" in available_policies("python") else Variant()
    first = simulate(generate(SMALL[kind]), LIMITS, variant)
    again = simulate(generate(SMALL[kind]), LIMITS, variant)
    assert first.counters == again.counters


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_implementations_decide_alike(kind):
    """Rust, pure Python and the PR's scan implement one behaviour: same decisions, same counters."""
    workload = generate(SMALL[kind])
    runs = [
        Variant("vllm", False, "rust"),
        Variant("vllm", False, "python"),
        Variant("vllm", False, "python", "scan"),
        *[Variant(p, False, "rust") for p in available_policies("rust") if p != "vllm"],
    ]
    counters = [simulate(workload, LIMITS, v).counters for v in runs]
    assert counters[0] == counters[1] == counters[2]
    for variant, c in zip(runs[3:], counters[3:]):
        assert c == simulate(workload, LIMITS, replace(variant, implementation="python")).counters, variant


@pytest.mark.parametrize("kind", sorted(SMALL))
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_unbounded_cache_encodes_each_item_once(kind, prefix_caching):
    workload = generate(SMALL[kind])
    limits = replace(LIMITS, prefix_caching=prefix_caching)
    result = simulate(workload, limits, Variant(), cache_size=UNBOUNDED, check=True)
    c = result.counters
    distinct = {i.identifier: i.length for s in workload.requests() for i in s.items}
    assert c.encoded_embeds == sum(distinct.values()) == c.distinct_embeds
    assert c.encoded_items == len(distinct)
    assert c.recomputed_embeds == c.evictions == 0


def test_more_cache_encodes_less_on_popular():
    workload = generate(SMALL["popular"])
    encoded = [simulate(workload, LIMITS, Variant(), cache_size=s).counters.encoded_embeds for s in (2560, 8192, 65536)]
    assert encoded[0] > encoded[1] > encoded[2]


@pytest.mark.skipif(not oracle_module.AVAILABLE, reason="the manager has no pluggable policies")
def test_oracle_is_a_ceiling_on_popular():
    workload = generate(WorkloadConfig(kind="popular", requests=150, catalogue=60, seed=9))
    vllm = simulate(workload, LIMITS, Variant()).counters.encoded_embeds
    best_real = min(
        simulate(workload, LIMITS, Variant(p, False, "python")).counters.encoded_embeds
        for p in available_policies("python")
    )
    oracle = simulate(workload, LIMITS, Variant("oracle", False, "python")).counters.encoded_embeds
    assert oracle < vllm
    assert oracle <= best_real


def test_prefix_behaviour_recomputes_items_still_in_use():
    """The seed scenario: chat turns holding an image twice, a small encoder cache, no prefix cache."""
    workload = generate(WorkloadConfig(kind="chat", requests=300, repeat_prob=1.0, think_steps=20.0, seed=0))
    limits = SchedulerLimits(max_num_batched_tokens=2048, prefix_caching=False)
    fixed = simulate(workload, limits, Variant("vllm", False, "python")).counters
    prefix = simulate(workload, limits, Variant("vllm", False, "python", "prefix")).counters
    assert fixed.evicted_in_use_embeds == 0
    assert prefix.evicted_in_use_embeds > 0
    assert prefix.recomputed_embeds >= prefix.evicted_in_use_embeds


def test_kv_pressure_preempts_and_recomputes():
    workload = generate(replace(SMALL["chat"], arrival_rate=2.0))
    largest = max(s.total_tokens for s in workload.requests())
    result = simulate(workload, SchedulerLimits(kv_capacity=largest + 2 * 16), check=True)
    assert result.counters.preemptions > 0
    assert result.counters.requests == workload.num_requests


def test_progress_reports_finished_requests():
    seen = []
    simulate(generate(SMALL["popular"]), LIMITS, progress=seen.append)
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
    monkeypatch.setitem(variants_module.MANAGERS, ("python", "broken"), manager)
    with pytest.raises(SimulationError, match=message):
        simulate(generate(SMALL["popular"]), LIMITS, "python", "broken", check=True)


def test_shared_prefix_stops_at_the_first_different_item():
    a = Item("a", 10, 100, "image")
    b = Item("b", 120, 50, "image")
    previous = RequestSpec("p", 0, "s", None, 200, 20, (a, b))
    same = RequestSpec("n", 0, "s", 1, 300, 5, (a, b, Item("c", 240, 10, "image")))
    assert shared_prefix(previous, same) == 220
    moved = RequestSpec("n", 0, "s", 1, 300, 5, (a, Item("b", 121, 50, "image")))
    assert shared_prefix(previous, moved) == 119
    shorter = RequestSpec("n", 0, "s", 1, 50, 5, ())
    assert shared_prefix(previous, shorter) == 9


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_decode_stretches_taken_at_once_change_nothing(kind):
    """Unchecked runs take decode-only stretches in one go; checked runs step by step."""
    workload = generate(replace(SMALL[kind], output_tokens=(64, 256)))
    for variant in (Variant(), Variant("vllm", True, "python")):
        fast = simulate(workload, LIMITS, variant).counters
        assert fast == simulate(workload, LIMITS, variant, check=True).counters


def test_oracle_future_orders_pending_uses_and_forgets_served_ones():
    recorder = oracle_module.Recorder()
    recorder.served("r1", 0, "a", 5)
    recorder.served("r2", 0, "a", 9)
    recorder.served("r2", 1, "b", 9)
    recorder.served("r1", 0, "a", 7)  # served again (after a preemption): the first time counts
    future = oracle_module.Future(recorder)
    assert future.next_use("a") == 5 and future.next_use("b") == 9
    assert future.next_use("c") == float("inf")
    future.served("r1", 0, "a", 6)
    assert future.next_use("a") == 9
    future.needed_again("r1", 0, "a")  # preempted: needed again, as soon as first recorded
    assert future.next_use("a") == 5
    future.served("r1", 0, "a", 8)
    future.served("r2", 0, "a", 9)
    assert future.next_use("a") == float("inf")
