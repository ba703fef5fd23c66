"""encoder_cache.vllm against vLLM 0.33's contract, with stand-in objects.

No vLLM needed: a stand-in ``vllm`` package (a version string and a base
``Scheduler`` that builds its manager the way vLLM's does) is put in
``sys.modules`` for each test, and ``encoder_cache.vllm`` is imported fresh
against it. The real vLLM is exercised in test_vllm_real.py.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import re
import subprocess
import sys
import time
import types
from types import SimpleNamespace

import pytest

import encoder_cache
import encoder_cache.observed
from encoder_cache import MultiModalFeature, PlaceholderRange, Request, reference

_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
_ASYNC_SCHEDULER_MODULE = "vllm.v1.core.sched.async_scheduler"


class StockManagerStandIn:
    """Has vLLM's manager hook but none of the step-level API."""

    @classmethod
    def create_manager(cls, *, cache_size, vllm_config):
        manager = cls()
        manager.cache_size = cache_size
        return manager


class SchedulerStandIn:
    """The parts of vLLM 0.33's Scheduler that the subclass relies on."""

    def __init__(self, vllm_config, ec_connector=None, cache_size=64):
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.is_encoder_decoder = vllm_config.model_config.is_encoder_decoder
        self.ec_connector = ec_connector
        self.rejected: list[tuple] = []
        ec_config = vllm_config.ec_manager_config
        manager_cls = StockManagerStandIn
        if ec_config.encoder_cache_manager_cls is not None:
            module, _, name = ec_config.encoder_cache_manager_cls.rpartition(".")
            manager_cls = getattr(importlib.import_module(module), name)
        self.encoder_cache_manager = manager_cls.create_manager(cache_size=cache_size, vllm_config=vllm_config)

    def _reject_on_encoder_cache_embed_mismatch(self, request, input_id, identifier, cached, requested):
        self.rejected.append((request.request_id, input_id, identifier, cached, requested))
        return cached != requested


class AsyncSchedulerStandIn(SchedulerStandIn):
    pass


class RecordingConnector:
    def __init__(self, remote=()):
        self.remote = set(remote)
        self.calls: list[tuple] = []

    def has_cache_item(self, identifier):
        return identifier in self.remote

    def update_state_after_alloc(self, request, input_id):
        self.calls.append(("alloc", request.request_id, input_id))

    def update_state_after_free(self, request, input_id):
        self.calls.append(("free", request.request_id, input_id))


def _install_vllm(monkeypatch, version="0.33.0"):
    """Put a stand-in vLLM in sys.modules and return a fresh encoder_cache.vllm."""
    names = ["vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched", _SCHEDULER_MODULE, _ASYNC_SCHEDULER_MODULE]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm"].__version__ = version
    sys.modules[_SCHEDULER_MODULE].Scheduler = SchedulerStandIn
    sys.modules[_ASYNC_SCHEDULER_MODULE].AsyncScheduler = AsyncSchedulerStandIn
    return _fresh_import(monkeypatch)


def _fresh_import(monkeypatch):
    # Recorded first, so teardown puts back what was there before, or removes
    # the module built on the stand-in when nothing was: a later test that
    # imports encoder_cache.vllm gets the real one.
    monkeypatch.setitem(sys.modules, "encoder_cache.vllm", None)
    del sys.modules["encoder_cache.vllm"]
    monkeypatch.setattr(encoder_cache, "vllm", None, raising=False)  # the import sets it
    return importlib.import_module("encoder_cache.vllm")


EMBED_SIZE = 3584


def _config(manager_cls="encoder_cache.vllm.EncoderCacheManager", options=None, enc_dec=False, chunked_mm=True):
    return SimpleNamespace(
        # Qwen2-VL-7B's shape: 3,584-wide embeddings in bfloat16, 7,168 bytes each.
        model_config=SimpleNamespace(
            is_encoder_decoder=enc_dec, get_inputs_embeds_size=lambda: EMBED_SIZE, dtype=SimpleNamespace(itemsize=2)
        ),
        scheduler_config=SimpleNamespace(disable_chunked_mm_input=not chunked_mm),
        ec_manager_config=SimpleNamespace(encoder_cache_manager_cls=manager_cls, manager_config=options or {}),
    )


def _request(request_id, items, num_computed_tokens=0):
    """items: (identifier, offset, length) in offset order."""
    features = [MultiModalFeature(ident, PlaceholderRange(offset, length)) for ident, offset, length in items]
    return Request(request_id, features, num_computed_tokens=num_computed_tokens)


# --- importing ---------------------------------------------------------------


def test_importing_the_package_does_not_import_vllm():
    code = (
        "import sys, encoder_cache, encoder_cache.reference, encoder_cache.request, encoder_cache.budget\n"
        "assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_vllm_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what a missing package looks like to `import`
    with pytest.raises(ImportError, match=r"needs vLLM 0\.33\.x, which is not installed: pip install"):
        _fresh_import(monkeypatch)


class _BrokenVllmFinder(importlib.abc.MetaPathFinder):
    """vLLM present but failing to load, as with a missing CUDA library."""

    def find_spec(self, name, path, target=None):
        if name == "vllm":
            raise ImportError("libcudart.so.13: cannot open shared object file")
        return None


def test_broken_vllm_is_reported_as_such(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenVllmFinder(), *sys.meta_path])
    with pytest.raises(ImportError, match=r"vLLM is installed but failed to import \(libcudart"):
        _fresh_import(monkeypatch)


@pytest.mark.parametrize("version", ["0.32.1", "0.34.0", "0.330.0", "1.0.0"])
def test_unsupported_vllm_version_is_refused(monkeypatch, version):
    monkeypatch.delenv("ENCODER_CACHE_ALLOW_VLLM_VERSION", raising=False)
    with pytest.raises(ImportError, match=rf"supports vLLM 0\.33\.x only, found {version}.*ALLOW_VLLM_VERSION"):
        _install_vllm(monkeypatch, version)


@pytest.mark.parametrize("version", ["0.33.0", "0.33.2", "0.33.1.dev4+gabc", "0.33.0+cpu"])
def test_every_033_release_is_accepted(monkeypatch, version):
    assert _install_vllm(monkeypatch, version).SUPPORTED_SERIES == "0.33"


def test_override_accepts_exactly_the_named_version(monkeypatch):
    monkeypatch.setenv("ENCODER_CACHE_ALLOW_VLLM_VERSION", "0.34.0")
    assert issubclass(_install_vllm(monkeypatch, "0.34.0").Scheduler, SchedulerStandIn)
    with pytest.raises(ImportError, match="found 0.35.0"):
        _install_vllm(monkeypatch, "0.35.0")


# --- the manager hook --------------------------------------------------------


def test_hook_resolves_by_qualified_name_and_builds_the_rust_manager(monkeypatch):
    hook = _install_vllm(monkeypatch)
    config = _config()
    module, _, name = config.ec_manager_config.encoder_cache_manager_cls.rpartition(".")
    resolved = getattr(importlib.import_module(module), name)
    manager = resolved.create_manager(cache_size=96, vllm_config=config)
    assert resolved is hook.EncoderCacheManager
    assert isinstance(manager, encoder_cache.EncoderCacheManager)
    assert manager.cache_size == 96 and manager.num_free_slots == 96
    assert manager.get_manager_metadata() is None
    request = _request("r", [("img", 0, 8)])
    assert manager.can_allocate(request, 0, 100, 0)
    manager.allocate(request, 0)
    assert manager.cached == {"img": {"r"}}


def test_hook_builds_the_encoder_decoder_variant(monkeypatch):
    hook = _install_vllm(monkeypatch)
    manager = hook.EncoderCacheManager.create_manager(cache_size=1500, vllm_config=_config(enc_dec=True))
    assert type(manager) is encoder_cache.EncoderDecoderCacheManager
    assert manager.cache_size == 1500
    assert manager.get_manager_metadata() is None


def test_hook_without_a_config_builds_the_plain_manager(monkeypatch):
    hook = _install_vllm(monkeypatch)
    assert isinstance(hook.EncoderCacheManager.create_manager(cache_size=4), encoder_cache.EncoderCacheManager)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"eviction": "lru", "capacity": 3},
            "unknown manager_config key 'capacity'; the keys are cache_size, cache_gib",
        ),
        ({"cache_size": 10, "cache_gib": 1}, "cache_size or cache_gib, not both"),
        ({"cache_size": 0}, "cache_size must be a positive int"),
        ({"cache_size": True}, "cache_size must be a positive int"),
        ({"cache_size": 1.5}, "cache_size must be a positive int"),
        ({"cache_gib": -1}, "cache_gib must be a positive number"),
        ({"cache_gib": float("nan")}, "cache_gib must be a positive number"),
        ({"cache_gib": "1"}, "cache_gib must be a positive number"),
        ({"policy": "lru"}, "policy must be one of vllm, gdsf, s3fifo, lfu-ghost, arc, duel or auto, got 'lru'"),
        ({"lookahead": "yes"}, "lookahead must be true or false"),
        ({"log_stats_interval": -1}, "log_stats_interval must be a number of seconds >= 0"),
        ({"log_stats_interval": float("inf")}, "log_stats_interval must be a number of seconds >= 0"),
    ],
)
def test_hook_refuses_bad_manager_config_naming_the_key(monkeypatch, options, message):
    hook = _install_vllm(monkeypatch)
    with pytest.raises(ValueError, match=re.escape(message)):
        hook.EncoderCacheManager.create_manager(cache_size=4, vllm_config=_config(options=options))


def test_hook_takes_auto_as_the_recommended_policy(monkeypatch):
    hook = _install_vllm(monkeypatch)
    manager = hook.EncoderCacheManager.create_manager(cache_size=64, vllm_config=_config(options={"policy": "auto"}))
    assert manager.policy == encoder_cache.reference.RECOMMENDED


def test_hook_takes_every_option(monkeypatch, caplog):
    hook = _install_vllm(monkeypatch)
    create = hook.EncoderCacheManager.create_manager
    default = create(cache_size=2048, vllm_config=_config())
    assert (default.cache_size, default.policy, default.lookahead) == (2048, "vllm", False)
    options = {"cache_size": 32768, "policy": "gdsf", "lookahead": True, "log_stats_interval": 0}
    with caplog.at_level(logging.INFO, logger="vllm.encoder_cache"):
        # Lookahead is taken only from a scheduler that marks waiting requests.
        manager = hook.Scheduler(_config(options=options), cache_size=2048).encoder_cache_manager
    assert (manager.cache_size, manager.policy, manager.lookahead) == (32768, "gdsf", True)
    assert type(manager) is hook.EncoderCacheManager, "no stats logging with log_stats_interval 0"
    logged = caplog.text
    assert "32768 embeddings (0.22 GiB at 7168 bytes each), policy gdsf, lookahead on" in logged
    extra = (32768 - 2048) * 7168
    assert f"{extra / 2**30:.2f} GiB more than the 2048 embeddings" in logged
    assert "lower --gpu-memory-utilization" in logged
    by_gib = create(cache_size=2048, vllm_config=_config(options={"cache_gib": 0.5}))
    assert by_gib.cache_size == 2**29 // 7168


def test_hook_logs_the_counters_every_interval(monkeypatch, caplog):
    """On the real clock: the manager's step hook waits in Rust, where a patched time.monotonic does not reach."""
    hook = _install_vllm(monkeypatch)
    manager = hook.EncoderCacheManager.create_manager(
        cache_size=64, vllm_config=_config(options={"log_stats_interval": 1.0})
    )
    request = _request("r", [("img", 0, 8), ("img", 10, 8)])
    with caplog.at_level(logging.INFO, logger="vllm.encoder_cache"):
        manager.get_freed_mm_hashes()  # the first step starts the interval
        manager.allocate(request, 0)
        manager.check_and_update_cache(request, 1)
        manager.get_freed_mm_hashes()
        assert "hit rate" not in caplog.text
        time.sleep(1.05)
        manager.get_freed_mm_hashes()
    assert "encoder cache: hit rate 50.0% (1 hits, 1 misses), 0 re-encodes" in caplog.text
    assert caplog.text.count("hit rate") == 1


def test_hook_refuses_policy_options_for_an_encoder_decoder_model(monkeypatch):
    hook = _install_vllm(monkeypatch)
    with pytest.raises(ValueError, match="encoder-decoder model"):
        hook.EncoderCacheManager.create_manager(
            cache_size=4, vllm_config=_config(options={"policy": "gdsf"}, enc_dec=True)
        )
    with pytest.raises(ValueError, match="events_endpoint"):
        hook.EncoderCacheManager.create_manager(
            cache_size=4, vllm_config=_config(options={"events_endpoint": "ipc:///tmp/unused"}, enc_dec=True)
        )
    sized = hook.EncoderCacheManager.create_manager(
        cache_size=4, vllm_config=_config(options={"cache_size": 9}, enc_dec=True)
    )
    assert type(sized) is encoder_cache.EncoderDecoderCacheManager and sized.cache_size == 9


@pytest.mark.parametrize("manager_cls", ["encoder_cache.vllm.EncoderCacheManager", None])
def test_lookahead_is_taken_under_either_scheduler_subclass(monkeypatch, manager_cls):
    hook = _install_vllm(monkeypatch)
    for scheduler_cls in (hook.Scheduler, hook.AsyncScheduler):
        config = _config(manager_cls=manager_cls, options={"lookahead": True, "log_stats_interval": 0})
        manager = scheduler_cls(config).encoder_cache_manager
        assert type(manager) is hook.EncoderCacheManager and manager.lookahead


def test_lookahead_without_the_scheduler_subclass_is_refused_at_startup(monkeypatch):
    hook = _install_vllm(monkeypatch)
    config = _config(options={"policy": "gdsf", "lookahead": True})
    # vLLM's own scheduler builds the configured manager in its constructor: it refuses.
    with pytest.raises(ValueError, match=re.escape(hook.LOOKAHEAD_NEEDS_SCHEDULER)):
        SchedulerStandIn(config)
    with pytest.raises(ValueError, match="--scheduler-cls encoder_cache.vllm.AsyncScheduler"):
        hook.EncoderCacheManager.create_manager(cache_size=4, vllm_config=config)
    # The mark is per construction: a scheduler built earlier leaves nothing behind.
    hook.Scheduler(config)
    with pytest.raises(ValueError, match="lookahead needs the scheduler"):
        AsyncSchedulerStandIn(config)
    assert SchedulerStandIn(_config(options={"lookahead": False})).encoder_cache_manager.lookahead is False


def test_hook_keeps_the_rust_managers_input_checks(monkeypatch):
    hook = _install_vllm(monkeypatch)
    with pytest.raises(ValueError):
        hook.EncoderCacheManager.create_manager(cache_size=-1, vllm_config=_config())


# --- the scheduler subclass --------------------------------------------------


@pytest.fixture(params=["Scheduler", "AsyncScheduler"])
def scheduler_cls(request, monkeypatch):
    """Each of our scheduler classes, built on the stand-in vLLM."""
    return getattr(_install_vllm(monkeypatch), request.param)


def test_each_scheduler_extends_its_vllm_namesake(monkeypatch):
    hook = _install_vllm(monkeypatch)
    assert issubclass(hook.Scheduler, SchedulerStandIn)
    assert issubclass(hook.AsyncScheduler, AsyncSchedulerStandIn)


def _scheduler(scheduler_cls, connector=None, cache_size=64, **config):
    return scheduler_cls(_config(**config), ec_connector=connector, cache_size=cache_size)


def test_scheduler_installs_the_rust_manager_when_none_is_configured(scheduler_cls):
    scheduler = _scheduler(scheduler_cls, cache_size=48, manager_cls=None)
    assert isinstance(scheduler.encoder_cache_manager, encoder_cache.EncoderCacheManager)
    assert scheduler.encoder_cache_manager.cache_size == 48


def test_scheduler_installs_the_encoder_decoder_variant_when_needed(scheduler_cls):
    scheduler = _scheduler(scheduler_cls, manager_cls=None, enc_dec=True)
    assert type(scheduler.encoder_cache_manager) is encoder_cache.EncoderDecoderCacheManager


def test_scheduler_refuses_a_configured_manager_without_the_step_api(scheduler_cls):
    stand_in = f"{__name__}.StockManagerStandIn"
    with pytest.raises(TypeError, match="step-level API.*StockManagerStandIn"):
        _scheduler(scheduler_cls, manager_cls=stand_in)


def test_scheduler_keeps_a_configured_manager_with_the_step_api(scheduler_cls):
    scheduler = _scheduler(scheduler_cls, manager_cls="encoder_cache.reference.EncoderCacheManager")
    assert type(scheduler.encoder_cache_manager) is reference.EncoderCacheManager


def _step(scheduler, request, computed, new_tokens, budget):
    """What vLLM's schedule() does with one request's encoder inputs."""
    result = scheduler._try_schedule_encoder_inputs(request, computed, new_tokens, budget)
    to_encode, _, _, remote, repeated = result
    if to_encode or remote or repeated:
        scheduler._allocate_encoder_inputs(request, to_encode + remote, repeated)
    return result


def test_scheduler_steps_match_the_reference_loop(scheduler_cls):
    """Same calls through the subclass (Rust) and on the Python reference."""
    scheduler = _scheduler(scheduler_cls, cache_size=40)
    oracle = reference.EncoderCacheManager(40)
    a = _request("a", [("x", 2, 8), ("y", 12, 8), ("x", 24, 8)])
    b = _request("b", [("y", 0, 8), ("z", 10, 16), ("w", 30, 16)])
    plan = [(a, 0, 16, 100), (a, 16, 20, 100), (b, 0, 32, 100), (b, 32, 20, 8)]
    for request, computed, new_tokens, budget in plan:
        got = _step(scheduler, request, computed, new_tokens, budget)
        expected = oracle.try_schedule_encoder_inputs(request, computed, new_tokens, budget)
        oracle.allocate_encoder_inputs(request, expected[0] + expected[3], expected[4])
        assert got == expected
        request.num_computed_tokens = computed + got[1]
        scheduler._free_encoder_inputs(request)
        oracle.free_encoder_inputs_before(request, request.num_computed_tokens)
        manager = scheduler.encoder_cache_manager
        assert manager.cached == oracle.cached
        assert manager.request_hash_refs == oracle.request_hash_refs
        assert manager.get_freed_mm_hashes() == oracle.get_freed_mm_hashes()
    assert scheduler.rejected == []


def test_scheduler_frees_only_inputs_before_confirmed_progress(scheduler_cls):
    scheduler = _scheduler(scheduler_cls)
    request = _request("r", [("p", 0, 4), ("q", 6, 4)])
    _step(scheduler, request, 0, 10, 100)
    # 10 tokens scheduled but 6 of them still in flight: only "p" is behind progress.
    request.num_computed_tokens, request.num_output_placeholders = 10, 6
    scheduler._free_encoder_inputs(request)
    assert scheduler.encoder_cache_manager.get_cached_input_ids(request) == {1}


def test_scheduler_tells_the_connector_per_input(scheduler_cls):
    connector = RecordingConnector(remote={"far"})
    scheduler = _scheduler(scheduler_cls, connector=connector)
    request = _request("r", [("near", 0, 4), ("far", 5, 4), ("near", 10, 4)])
    to_encode, num_new, _, remote, repeated = _step(scheduler, request, 0, 14, 100)
    assert (to_encode, num_new, remote, repeated) == ([0], 14, [1], [2])
    request.num_computed_tokens = 14
    scheduler._free_encoder_inputs(request)
    assert connector.calls == [
        ("alloc", "r", 0),
        ("alloc", "r", 1),
        ("free", "r", 0),
        ("free", "r", 1),
        ("free", "r", 2),
    ]


def test_scheduler_reports_embed_count_mismatch_through_vllms_hook(scheduler_cls):
    scheduler = _scheduler(scheduler_cls)
    _step(scheduler, _request("a", [("same-uuid", 0, 8)]), 0, 8, 100)
    clash = _request("b", [("same-uuid", 0, 12)])
    assert scheduler._try_schedule_encoder_inputs(clash, 0, 12, 77) == ([], 0, 77, [], [])
    assert scheduler.rejected == [("b", 0, "same-uuid", 8, 12)]


@pytest.mark.parametrize("chunked_mm", [True, False])
def test_scheduler_passes_vllms_chunked_mm_setting(scheduler_cls, chunked_mm):
    scheduler = _scheduler(scheduler_cls, chunked_mm=chunked_mm)
    request = _request("r", [("img", 4, 10)])
    _, num_new_tokens, *_ = scheduler._try_schedule_encoder_inputs(request, 0, 8, 100)
    assert num_new_tokens == (8 if chunked_mm else 4)


def test_scheduler_answers_steps_past_every_item_without_the_manager(scheduler_cls):
    scheduler = _scheduler(scheduler_cls)
    request = _request("r", [("x", 0, 8), ("y", 10, 8)])
    assert request.num_prompt_tokens == 18

    def unexpected(*args, **kwargs):
        raise AssertionError("the manager was called")

    scheduler.encoder_cache_manager.try_schedule_encoder_inputs = unexpected
    # Decoding (computed tokens at the prompt's end), or a step of no tokens: nothing to schedule.
    for computed, new_tokens in [(18, 1), (40, 3), (4, 0)]:
        to_encode, num_new, budget, remote, repeated = scheduler._try_schedule_encoder_inputs(
            request, computed, new_tokens, 100
        )
        assert (list(to_encode), num_new, budget, list(remote), list(repeated)) == ([], new_tokens, 100, [], [])
    # An item still ahead goes to the manager.
    with pytest.raises(AssertionError, match="manager was called"):
        scheduler._try_schedule_encoder_inputs(request, 17, 1, 100)


def test_encoder_decoder_scheduler_frees_all_once_decoding_started(scheduler_cls):
    scheduler = _scheduler(scheduler_cls, manager_cls=None, enc_dec=True, cache_size=100)
    request = _request("r", [("audio", 0, 30)])
    to_encode, *_ = _step(scheduler, request, 0, 1, 100)
    assert to_encode == [0] and scheduler.encoder_cache_manager.num_free_slots == 70
    request.num_computed_tokens = 1
    scheduler._free_encoder_inputs(request)
    assert scheduler.encoder_cache_manager.num_free_slots == 100
