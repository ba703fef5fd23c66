"""``manager_config`` options inside vLLM 0.33's real scheduler.

``policy="vllm"`` (with every other key at its default) schedules exactly as
stock vLLM through both switches; a larger ``cache_size`` or ``cache_gib``
reaches the manager and encodes less; every policy with ``lookahead`` runs
the same traffic to completion with the waiting marks equal to vLLM's waiting
queue at every step, and ``lookahead`` under vLLM's own scheduler is refused
when the scheduler is built. Skipped unless vLLM 0.33 is importable.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

import vllm_harness as harness  # noqa: E402

import encoder_cache  # noqa: E402
import encoder_cache.vllm as hook  # noqa: E402

pytestmark = pytest.mark.vllm

MANAGER = "encoder_cache.vllm.EncoderCacheManager"
SETUP = harness.Setup()
WORKLOAD = dict(seed=1, num_conversations=12, num_turns=4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return harness.model_config(tmp_path_factory.mktemp("tiny-llava"))


def _encoded(steps) -> int:
    return sum(len(ids) for step in steps for ids in step["encoder_inputs"].values())


@pytest.mark.parametrize("variant", ["manager", "scheduler"])
def test_policy_vllm_is_stock_vllm(model, variant):
    specs = harness.conversations(**WORKLOAD)
    stock = harness.run(harness.build_scheduler("stock", model, SETUP), specs).steps
    options = {"policy": "vllm", "lookahead": False, "log_stats_interval": 0}
    scheduler = harness.build_scheduler(variant, model, SETUP, manager_cls=MANAGER, manager_config=options)
    assert scheduler.encoder_cache_manager.policy == "vllm"
    ours = harness.run(scheduler, specs).steps
    assert ours == stock
    assert _total_evictions(stock) > 0, "the workload must evict for the comparison to mean anything"


def _total_evictions(steps) -> int:
    return sum(len(step["freed_hashes"]) for step in steps)


@pytest.mark.parametrize("key", ["cache_size", "cache_gib"])
def test_a_larger_cache_reaches_the_manager_and_encodes_less(model, key):
    specs = harness.conversations(**WORKLOAD)
    stock = harness.run(harness.build_scheduler("stock", model, SETUP), specs).steps
    per_embed = model.get_inputs_embeds_size() * model.dtype.itemsize
    size = 8 * SETUP.encoder_cache_size
    value = size if key == "cache_size" else size * per_embed / 2**30
    scheduler = harness.build_scheduler("scheduler", model, SETUP, manager_cls=MANAGER, manager_config={key: value})
    assert scheduler.encoder_cache_manager.cache_size == size
    ours = harness.run(scheduler, specs).steps
    assert _encoded(ours) < _encoded(stock)
    assert sum(1 for step in ours for output in step["outputs"] if output[2] is not None) == len(specs)


@pytest.mark.parametrize("policy", encoder_cache.POLICIES)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_every_policy_with_lookahead_follows_the_waiting_queue(model, policy, async_scheduling):
    setup = harness.Setup(**{**SETUP.__dict__, "async_scheduling": async_scheduling, "max_num_seqs": 4})
    options = {"policy": policy, "lookahead": True}
    scheduler = harness.build_scheduler("scheduler", model, setup, manager_cls=MANAGER, manager_config=options)
    manager = scheduler.encoder_cache_manager
    assert (manager.policy, manager.lookahead) == (policy, True)
    requests = [harness.make_request(spec) for spec in harness.conversations(**WORKLOAD)]
    for request in requests:
        scheduler.add_request(request)
    marked_steps = encoded = 0
    for _ in range(10_000):
        if not scheduler.has_unfinished_requests():
            break
        waiting = {r.request_id for r in scheduler.waiting if r.mm_features}
        output = scheduler.schedule()
        # The marks were taken from the queue as it stood before this step's evictions.
        assert set(manager.snapshot().get("waiting", {})) == waiting
        marked_steps += bool(waiting)
        encoded += sum(len(ids) for ids in output.scheduled_encoder_inputs.values())
        scheduler.update_from_output(output, harness.fake_model_output(scheduler, output))
        manager.check_invariants()
    assert not scheduler.has_unfinished_requests()
    assert marked_steps > 0, "requests must have waited for the marks to mean anything"
    stats = manager.stats()
    assert stats["hits"] > 0
    assert stats["misses"] == encoded, "one miss per item the scheduler sent to the encoder"
    assert set(stats["by_modality"]) == {"image"}
    # Every request finished: nothing is marked or referenced any more.
    assert manager.snapshot().get("waiting", {}) == {}
    assert manager.num_freeable_slots == manager.cache_size


def test_lookahead_leaves_items_of_the_cached_prefix_unmarked(model):
    """A turn that re-sends an earlier turn's image after the same text finds
    it in the KV prefix cache and never looks it up: its waiting mark holds
    only its new image. A request with other text before the same image
    marks both."""
    scheduler = harness.build_scheduler(
        "scheduler", model, SETUP, manager_cls=MANAGER, manager_config={"lookahead": True}
    )
    manager = scheduler.encoder_cache_manager
    old, new = harness.Image("old", 48), harness.Image("new", 48)
    text = tuple(range(100, 132))  # two full blocks before the first image
    first = harness.RequestSpec("turn-1", 0, (*text, old, *range(200, 220)), max_tokens=2)
    assert harness.run(scheduler, [first]).steps, "the first turn runs and leaves its blocks cached"
    second = harness.RequestSpec("turn-2", 0, (*text, old, *range(200, 220), new, 9), max_tokens=2)
    other = harness.RequestSpec("other", 0, (*range(300, 332), old, new, 9), max_tokens=2)
    for spec in (second, other):
        scheduler.add_request(harness.make_request(spec))
    output = scheduler.schedule()
    assert manager.snapshot()["waiting"] == {"turn-2": ["new"], "other": ["old", "new"]}
    scheduled = output.num_scheduled_tokens
    assert scheduled["turn-2"] < scheduled["other"], "turn-2 starts past its cached prefix, as its mark said"
    scheduler.update_from_output(output, harness.fake_model_output(scheduler, output))
    manager.check_invariants()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lookahead_under_vllms_own_scheduler_is_refused_at_startup(model, async_scheduling):
    setup = harness.Setup(**{**SETUP.__dict__, "async_scheduling": async_scheduling})
    with pytest.raises(ValueError, match="lookahead needs the scheduler that marks waiting requests"):
        harness.build_scheduler("manager", model, setup, manager_config={"lookahead": True})


def test_stock_manager_classes_are_untouched(model):
    scheduler = harness.build_scheduler("stock", model, SETUP)
    assert not isinstance(scheduler.encoder_cache_manager, encoder_cache.EncoderCacheManager)
    assert hook.OPTION_KEYS == (
        "cache_size",
        "cache_gib",
        "policy",
        "lookahead",
        "log_stats_interval",
        "metrics_port",
        "metrics_host",
        "events_endpoint",
        "events_replay_endpoint",
        "events_topic",
        "events_buffer_steps",
        "events_interval_ms",
    )
