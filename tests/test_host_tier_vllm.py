"""The host-tier connector against vLLM 0.33's own ``ECCPUConnector``.

- Lockstep: random operation sequences through vLLM's ``EmbeddingCache`` and
  ``HostBlockCache(policy="fifo")``: every return value (entries as their
  fields), every refusal (vLLM's AssertionError is our ValueError, KeyError
  is KeyError), the free-block stack, the eviction order, the evictable
  block count, every entry and every entry object a caller still holds,
  compared after every call.
- End to end: vLLM's real ``Scheduler`` on CPU (tests/vllm_harness.py) with
  vLLM's ``ECCPUConnector`` and with ``encoder_cache.vllm.HostTierConnector``,
  the worker's save and load reports faked from each step's metadata: under
  ``"fifo"`` every step's scheduling, saves and loads are vLLM's; the other
  policies load from the host tier too.

Skipped unless vLLM 0.33 is importable; run with /work/vllm-venv (docs/vllm.md).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

import vllm_harness as harness  # noqa: E402
from host_tier_harness import HIDDEN, ROW_BYTES, build, drive, totals  # noqa: E402
from host_tier_twin import random_operations  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache import EmbeddingCache  # noqa: E402

import encoder_cache.vllm as hook  # noqa: E402
from encoder_cache import HOST_POLICIES, HostBlockCache, host_tier  # noqa: E402
from encoder_cache.host_tier import HostTierScheduler  # noqa: E402

pytestmark = pytest.mark.vllm


# --- lockstep with EmbeddingCache ----------------------------------------------


def outcome(call):
    try:
        result = call()
    except AssertionError:
        return ("raised", ValueError)  # vLLM asserts where we raise ValueError
    except (KeyError, ValueError) as exc:
        return ("raised", type(exc))
    return ("ok", fields(result))


def fields(entry):
    if entry is None or isinstance(entry, bool):
        return entry
    return (tuple(entry.block_ids), entry.shape, entry.ready, entry.evictable)


def vllm_state(cache: EmbeddingCache) -> dict:
    return {
        "free_blocks": list(cache._free_blocks),
        "eviction_order": list(cache._entries_free_list),
        "evictable_blocks": cache._evictable_block_count,
        "held": cache.has_held_entries(),
        "entries": {key: fields(entry) for key, entry in sorted(cache._entries.items())},
    }


def our_state(cache: HostBlockCache) -> dict:
    return {
        "free_blocks": cache.free_blocks,
        "eviction_order": cache.eviction_order(),
        "evictable_blocks": cache.evictable_blocks,
        "held": cache.has_held_entries(),
        "entries": {key: fields(cache.get(key)) for key in sorted(cache.keys())},
    }


@pytest.mark.parametrize("seed", range(40))
def test_fifo_is_embedding_cache_call_for_call(seed):
    num_blocks = 6 + seed % 10  # allocations beyond the pool come up too
    theirs, ours = EmbeddingCache(num_blocks), HostBlockCache(num_blocks)
    held = []
    for step, (method, args) in enumerate(random_operations(seed, 700, num_keys=14, max_blocks=8)):
        want = outcome(lambda: getattr(theirs, method)(*args))  # noqa: B023
        got = outcome(lambda: getattr(ours, method)(*args))  # noqa: B023
        assert got == want, (step, method, args)
        if method in ("alloc", "get", "pin_if_ready") and want[0] == "ok" and want[1] is not None:
            held.append((theirs.get(args[0]), ours.get(args[0])))
        state = vllm_state(theirs)
        assert our_state(ours) == state, (step, method, args)
        for their_entry, our_entry in held[-30:]:
            assert (our_entry.ready, our_entry.evictable) == (their_entry.ready, their_entry.evictable)
    evicted = ours.stats()["evictions"]
    assert evicted > 5, "the sequence must evict"
    ours.check_invariants()


def test_the_entry_api_is_vllms():
    """Every public member of vLLM's cache and entry is on ours."""
    from vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache import CacheEntry

    def public(cls):
        return {n for n in dir(cls) if not n.startswith("_")}

    assert public(EmbeddingCache) <= public(HostBlockCache)
    # CacheEntry's mark_ready and pin mutate it directly; vLLM only calls them from inside its cache.
    assert public(CacheEntry) - {"mark_ready", "pin"} <= public(type(HostBlockCache(1).alloc("x", 0)))


# --- vLLM's real scheduler with the connector ----------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return harness.model_config(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture
def v2_runner(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")


SETUP = harness.Setup(encoder_cache_size=256, encoder_compute_budget=256)
# A host region of 640 rows: it holds a few of the pool's images and must evict.
REGION_ROWS = 640
EXTRA = {"ec_cpu_bytes": REGION_ROWS * ROW_BYTES}


def _specs():
    return harness.conversations(seed=3, num_conversations=20, num_turns=4, num_images=30)


@pytest.mark.parametrize("variant", list(harness.VARIANTS))
@pytest.mark.parametrize("in_flight", [1, 2], ids=["sync", "async"])
def test_fifo_schedules_saves_and_loads_as_vllms_connector(model, v2_runner, variant, in_flight):
    """Stock vLLM with its connector against ours, alone or with our manager or
    scheduler, under sync scheduling and async (two steps in flight)."""
    setup = dataclasses.replace(SETUP, async_scheduling=in_flight == 2)
    vllms = build(model, setup, "ECCPUConnector", EXTRA)
    hosts = build(model, setup, "HostTierConnector", {**EXTRA, "ec_cpu_policy": "fifo"}, variant)
    assert type(vllms.ec_connector.connector_scheduler._cache) is EmbeddingCache
    assert type(hosts.ec_connector.connector_scheduler._cache) is HostBlockCache
    ours_cls = hook.AsyncScheduler if setup.async_scheduling else hook.Scheduler
    assert isinstance(hosts, ours_cls) == (variant == "scheduler")
    assert isinstance(hosts.encoder_cache_manager, hook.EncoderCacheManager) == (variant != "stock")
    stock, ours = drive(vllms, _specs(), in_flight=in_flight), drive(hosts, _specs(), in_flight=in_flight)
    for step, (a, b) in enumerate(zip(stock, ours)):
        assert a == b, f"step {step}: { ({k: (a[k], b[k]) for k in a if a[k] != b[k]}) }"
    assert len(stock) == len(ours)
    counts = totals(stock)
    assert counts["loaded"] > 0 and counts["encoded"] > 0, counts
    # The region is small: the saves took more blocks than it has, so some evicted and the policy chose.
    assert sum(len(blocks) for step in stock for blocks in step["saves"].values()) > REGION_ROWS
    # Loads replace encodes: without the connector, vLLM encodes every loaded item again.
    without = harness.run(harness.build_scheduler("stock", model, setup), _specs(), in_flight=in_flight).steps
    assert (
        sum(len(ids) for step in without for ids in step["encoder_inputs"].values())
        == counts["encoded"] + counts["loaded"]
    )


@pytest.mark.parametrize("policy", HOST_POLICIES[1:])
def test_other_policies_run_in_the_real_scheduler(model, v2_runner, policy):
    scheduler = build(model, SETUP, "HostTierConnector", {**EXTRA, "ec_cpu_policy": policy})
    delegate = scheduler.ec_connector.connector_scheduler
    assert isinstance(delegate, HostTierScheduler) and delegate.host_cache.policy == policy
    cache = delegate.host_cache
    records = drive(scheduler, _specs())
    cache.check_invariants()
    assert not cache.has_held_entries(), "every load was unpinned, every save marked ready"
    counts = totals(records)
    assert counts["loaded"] > 0 and cache.stats()["evictions"] > 0, (counts, cache.stats())


def test_connector_names(model, v2_runner):
    assert hook.ECCPUConnector is hook.HostTierConnector is host_tier.HostTierConnector
    with pytest.raises(AttributeError):
        hook.NoSuchConnector  # noqa: B018


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ec_cpu_policy": "lru"}, "ec_cpu_policy must be one of fifo, gdsf, s3fifo, got 'lru'"),
        ({"ec_cpu_policy": None}, "ec_cpu_policy must be one of"),
        ({"ec_cpu_log_stats_interval": -1}, "ec_cpu_log_stats_interval must be a number of seconds >= 0"),
        ({"ec_cpu_log_stats_interval": "60"}, "ec_cpu_log_stats_interval must be a number of seconds >= 0"),
        ({"ec_cpu_log_stats_interval": True}, "ec_cpu_log_stats_interval must be a number of seconds >= 0"),
    ],
)
def test_bad_options_stop_the_scheduler_before_the_region_is_mapped(model, v2_runner, extra, message):
    regions = set(Path("/dev/shm").glob("vllm_ec_*"))
    with pytest.raises(ValueError, match=message):
        build(model, SETUP, "HostTierConnector", {**EXTRA, **extra})
    assert set(Path("/dev/shm").glob("vllm_ec_*")) == regions, "no region file left behind"


def test_the_counters_are_logged_every_interval(model, v2_runner, monkeypatch, caplog):
    clock = [100.0]
    monkeypatch.setattr(host_tier.time, "monotonic", lambda: clock[0])
    scheduler = build(model, SETUP, "HostTierConnector", {**EXTRA, "ec_cpu_log_stats_interval": 30})
    delegate = scheduler.ec_connector.connector_scheduler
    with caplog.at_level(logging.INFO, logger="vllm.encoder_cache"):
        delegate.build_connector_meta(None)  # the first step starts the interval
        delegate.host_cache.alloc("img", 8, (8, HIDDEN))
        clock[0] += 29
        delegate.build_connector_meta(None)
        assert "loads" not in caplog.text
        clock[0] += 2
        delegate.build_connector_meta(None)
    scheduler.shutdown()
    assert "encoder cache host tier: 0 loads, 1 saves (0 not saved for want of space), 0 evictions, 1 entries" in (
        caplog.text
    )
    assert f"using 8 of {delegate.host_cache.num_blocks} blocks" in caplog.text
