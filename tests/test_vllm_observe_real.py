"""Metrics and cache events inside vLLM 0.33's real scheduler: with events on,
both switches schedule exactly as stock, and a subscriber's index ends equal
to the manager's cached set; ``metrics_port`` serves values equal to
``stats()``. Skipped unless vLLM 0.33 is importable."""

from __future__ import annotations

import shutil
import socket
import tempfile
import urllib.request

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)
pytest.importorskip("zmq")

import vllm_harness as harness  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from encoder_cache.events import CacheEventSubscriber, Engine  # noqa: E402
from encoder_cache.metrics import COUNTERS, MULTIPROC_ENV, PREFIX  # noqa: E402

pytestmark = pytest.mark.vllm

MANAGER = "encoder_cache.vllm.EncoderCacheManager"
SETUP = harness.Setup()
WORKLOAD = dict(seed=1, num_conversations=12, num_turns=4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return harness.model_config(tmp_path_factory.mktemp("tiny-llava"))


@pytest.mark.parametrize("variant", ["manager", "scheduler"])
def test_events_change_no_step_and_the_index_follows_the_cache(model, variant):
    directory = tempfile.mkdtemp(prefix="ec-vllm-", dir="/tmp")
    try:
        endpoint, replay = f"ipc://{directory}/pub", f"ipc://{directory}/replay"
        options = {"events_endpoint": endpoint, "events_replay_endpoint": replay, "log_stats_interval": 0}
        specs = harness.conversations(**WORKLOAD)
        stock = harness.run(harness.build_scheduler("stock", model, SETUP), specs).steps
        scheduler = harness.build_scheduler(variant, model, SETUP, manager_cls=MANAGER, manager_config=options)
        manager = scheduler.encoder_cache_manager
        publisher = manager.observers.events
        assert manager.observers.publisher is None, "the publisher's thread drains the manager, not the step"
        with CacheEventSubscriber({"e": Engine(endpoint, replay)}) as subscriber:
            assert harness.run(scheduler, specs).steps == stock
            publisher.flush()
            engine = subscriber.engine("e")
            for _ in range(200):  # bounded: the tail is replayed if the last message is missed
                subscriber.poll(0.02)
                subscriber.sync("e")
                if engine.seq == publisher.sent - 1:
                    break
            assert engine.complete and engine.seq == publisher.sent - 1
            assert {h: e for h, (e, _) in engine.items.items()} == dict(manager.num_embeds_by_hash)
            assert manager.stats()["evictions"] > 0, "the run must evict for the index to be tested"
        scheduler.shutdown()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_metrics_port_serves_the_schedulers_counters(model, monkeypatch):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {"metrics_port": port, "metrics_host": "127.0.0.1", "log_stats_interval": 0}
    scheduler = harness.build_scheduler("scheduler", model, SETUP, manager_cls=MANAGER, manager_config=options)
    manager = scheduler.encoder_cache_manager
    harness.run(scheduler, harness.conversations(**WORKLOAD))
    manager.observers.update_metrics(manager)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {
        (s.name, s.labels.get("modality")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith(PREFIX) and s.labels.get("engine") == "0"
    }
    stats = manager.stats()
    assert found[PREFIX + "capacity_embeds", None] == manager.cache_size
    assert found[PREFIX + "entries", None] == stats["entries"]
    for name, (key, _) in COUNTERS.items():
        assert found[PREFIX + name + "_total", "image"] == stats["by_modality"]["image"][key]
    assert stats["misses"] > 0
