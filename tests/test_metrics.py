"""Prometheus metrics with real prometheus_client: an engine-like child process
runs an observed manager in multiprocess mode; this process collects its
values the way vLLM's /metrics does and checks them against ``stats()``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, make_asgi_app, multiprocess  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from encoder_cache import EncoderCacheManager  # noqa: E402
from encoder_cache.metrics import COUNTERS, GAUGES, MULTIPROC_ENV, PREFIX, CacheMetrics  # noqa: E402
from encoder_cache.observed import METRICS_OFF_LINE, ObserveOptions, StepObservers, observed_class  # noqa: E402

HERE = Path(__file__).parent


def run_engine_child(tmp_path: Path) -> dict[str, Any]:
    """Run tests/observe_workload.py in a child process writing to a fresh
    multiprocess directory; returns what it reports of its manager."""
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    out = tmp_path / "stats.json"
    env = {**os.environ, MULTIPROC_ENV: str(metrics_dir)}
    subprocess.run([sys.executable, str(HERE / "observe_workload.py"), str(out)], env=env, check=True, timeout=120)
    report = json.loads(out.read_text())
    report["dir"] = str(metrics_dir)
    return report


def expected_samples(report: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Sample name and labels -> value, as the exported series should read."""
    stats, before = report["stats"], report["before_reset"]
    engine = (("engine", "3"), ("model_name", "m"))
    want: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        (PREFIX + "capacity_embeds", engine): report["cache_size"],
    }
    for key in ("used_embeds", "freeable_embeds", "entries"):
        want[PREFIX + key, engine] = stats[key]
    modalities = set(stats["by_modality"]) | set(before["by_modality"])
    for modality in modalities:
        labels = tuple(sorted((*engine, ("modality", modality))))
        for name, (key, _) in COUNTERS.items():
            total = sum(s["by_modality"].get(modality, {}).get(key, 0) for s in (stats, before))
            want[PREFIX + name + "_total", labels] = total
    return want


def samples(families: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in families:
        for sample in family.samples:
            if sample.name.startswith(PREFIX) and not sample.name.endswith("_created"):
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def scrape_asgi(app: Any) -> str:
    """GET /metrics from an ASGI app, in process (no socket)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 200
    return b"".join(m.get("body", b"") for m in sent[1:]).decode()


@pytest.fixture(scope="module")
def engine_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_engine_child(tmp_path_factory.mktemp("engine"))


def test_the_child_workload_exercises_every_counter(engine_report: dict[str, Any]) -> None:
    """The comparison below is meaningful: every counter moved, in every modality, on both sides of the reset."""
    for stats in (engine_report["before_reset"], engine_report["stats"]):
        assert set(stats["by_modality"]) == {"image", "audio", "video"}
        for values in stats["by_modality"].values():
            assert all(values[key] > 0 for key, _ in COUNTERS.values()), values
    assert engine_report["stats"]["freeable_embeds"] > 0


def test_multiprocess_collector_reads_the_engine_values(engine_report: dict[str, Any]) -> None:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=engine_report["dir"])
    assert samples(registry.collect()) == expected_samples(engine_report)


def test_metrics_endpoint_as_vllm_builds_it(engine_report: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33's /metrics with PROMETHEUS_MULTIPROC_DIR set: a fresh
    CollectorRegistry with a MultiProcessCollector, served by prometheus_client's
    ASGI app (vllm/v1/metrics/prometheus.py, vllm/entrypoints/serve/instrumentator/metrics.py)."""
    monkeypatch.setenv(MULTIPROC_ENV, engine_report["dir"])
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    text = scrape_asgi(make_asgi_app(registry=registry))
    assert samples(text_string_to_metric_families(text)) == expected_samples(engine_report)
    types = {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}
    for name, text_help in GAUGES.items():
        assert types[PREFIX + name] == ("gauge", text_help)
    for name, (_, text_help) in COUNTERS.items():
        assert types[PREFIX + name] == ("counter", text_help)


@pytest.mark.vllm
def test_vllm_metrics_route_shows_the_engine_values(
    engine_report: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own /metrics route (attach_router), in process."""
    pytest.importorskip("vllm")
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router

    monkeypatch.setenv(MULTIPROC_ENV, engine_report["dir"])
    app = fastapi.FastAPI()
    attach_router(app)
    response = TestClient(app).get("/metrics")
    assert response.status_code == 200
    assert samples(text_string_to_metric_families(response.text)) == expected_samples(engine_report)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_metrics_port_serves_the_values_without_a_multiprocess_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from observe_workload import run_steps

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    port = free_port()
    options = ObserveOptions.parse({"metrics_port": port - 2, "metrics_host": "127.0.0.1"})
    announced: list[str] = []
    observers = options.observers(engine=2, model_name="x", announce=announced.append)
    assert announced == []
    manager = observed_class(EncoderCacheManager)(64)
    manager.observers = observers
    observers.metrics_interval = 0.0
    run_steps(manager, 20, seed=7)
    stats = manager.stats()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = samples(text_string_to_metric_families(text))
    engine = (("engine", "2"), ("model_name", "x"))
    assert found[PREFIX + "capacity_embeds", engine] == 64
    assert found[PREFIX + "used_embeds", engine] == stats["used_embeds"]
    assert found[PREFIX + "entries", engine] == stats["entries"]
    for modality, values in stats["by_modality"].items():
        labels = tuple(sorted((*engine, ("modality", modality))))
        for name, (key, _) in COUNTERS.items():
            assert found[PREFIX + name + "_total", labels] == values[key]


def test_without_either_one_startup_line_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    announced: list[str] = []
    observers = ObserveOptions.parse({}).observers(announce=announced.append)
    assert announced == [METRICS_OFF_LINE]
    assert observers.metrics is None and observers.publisher is None and observers.events is None
    assert MULTIPROC_ENV in METRICS_OFF_LINE and "metrics_port" in METRICS_OFF_LINE


def test_counters_never_go_down_across_reset_stats() -> None:
    """Updated at a step, then reset_stats(), then more work: the counters hold the sum."""
    from observe_workload import run_steps

    registry = CollectorRegistry()
    manager = observed_class(EncoderCacheManager)(64)
    manager.observers = StepObservers(metrics=CacheMetrics(engine=9, registry=registry), metrics_interval=3600)
    run_steps(manager, 10, seed=1)  # the first step updated; the rest waited for the interval
    before = manager.stats()
    manager.reset_stats()
    run_steps(manager, 10, seed=2)
    manager.observers.update_metrics(manager)
    after = manager.stats()
    for modality in before["by_modality"]:
        want = before["by_modality"][modality]["misses"] + after["by_modality"].get(modality, {}).get("misses", 0)
        got = registry.get_sample_value(
            PREFIX + "misses_total", {"model_name": "", "engine": "9", "modality": modality}
        )
        assert got == want


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"metrics_port": 0}, "metrics_port"),
        ({"metrics_port": True}, "metrics_port"),
        ({"metrics_host": 5}, "metrics_host"),
        ({"events_endpoint": "127.0.0.1:5"}, "events_endpoint"),
        ({"events_topic": "t"}, "needs events_endpoint"),
        ({"events_endpoint": "ipc:///tmp/x", "events_buffer_steps": 0}, "events_buffer_steps"),
        ({"events_endpoint": "ipc:///tmp/x", "events_interval_ms": -1}, "events_interval_ms"),
        ({"events_endpoint": "ipc:///tmp/x", "events_interval_ms": 0}, "events_interval_ms"),
        ({"events_endpoint": "ipc:///tmp/x", "events_interval_ms": float("nan")}, "events_interval_ms"),
        ({"events_endpoint": "ipc:///tmp/x", "events_interval_ms": "5"}, "events_interval_ms"),
        ({"events_interval_ms": 1}, "needs events_endpoint"),
    ],
)
def test_bad_options_are_refused_naming_the_key(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ObserveOptions.parse(options)
