"""Cache events under load: how fast a publishing manager's events reach a
subscriber, and what publishing adds to vLLM 0.33's real scheduler step.

``python benches/bench_events.py [--runs N] [--steps N]`` prints the tables of
BENCHMARKS.md, "Cache events":

- *Throughput*: a manager steps as fast as it can, every step allocating 64
  new items (8 requests of 8 images; all misses, so every step also evicts
  64), publishing on an
  ``ipc://`` endpoint; a subscriber in another process receives every batch.
  Events per second = event maps received (64 stored + 1 removed per step)
  over the time from the first step to the last batch received; items per
  second counts each stored item and each removed hash. Events per CPU-second
  divides by the CPU time of the publishing process instead (the manager's
  thread and the publisher's), which other load on the machine does not
  inflate. Lost batches are counted (a subscriber that keeps up loses none).
  Then the same with the publisher watching the manager (``watch``, as the
  vLLM hook runs it): one message per drain, items per second as above.
- *CPU per step*: the same loop without a subscriber, events off and on;
  on, split between the scheduler's thread (``time.thread_time``) and the
  publisher's (the rest of the process's CPU until it has sent everything).
- *Step cost*: vLLM's scheduler with ``encoder_cache.vllm.Scheduler`` on the
  workloads of ``bench_vllm_scheduler.py``, without and with
  ``events_endpoint`` (plus a replay socket, and a subscriber process
  attached, so batches really go out), and events off once more beside them
  (the difference of the two "off" columns is the harness's noise). Rounds
  interleave the three; each step
  is taken at its fastest round and the mean over steps is reported (the
  method of ``bench_vllm_scheduler.py``). Run twice: steps back to back (the
  publisher's thread then takes the GIL inside the timed steps), and with
  ``--model-ms`` of sleep after each ``schedule()``, untimed, where vLLM's
  engine waits for the model. Needs vLLM 0.33.

Under pytest (benches run once, untimed) a short throughput run checks that
every event arrives in order and the index matches the manager.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("zmq")

from encoder_cache import EncoderCacheManager, MultiModalFeature, PlaceholderRange, Request
from encoder_cache.events import CacheEventSubscriber, Engine, EventPublisher, wire
from encoder_cache.observed import StepObservers, observed_class

ITEMS_PER_STEP = 64
ITEMS_PER_REQUEST = 8
ITEM_EMBEDS = 16


def _subscribe(endpoint: str, replay: str, expected: Any, started: Any, results: Any) -> None:
    """A subscriber process: applies batches until batch ``expected.value - 1``
    (a shared int, -1 until the publisher knows it), then reports."""
    with CacheEventSubscriber({"e": Engine(endpoint, replay)}) as subscriber:
        subscriber.sync("e")
        started.set()
        engine = subscriber.engine("e")
        deadline = time.monotonic() + 120
        while (expected.value < 0 or engine.seq < expected.value - 1) and time.monotonic() < deadline:
            subscriber.poll(0.05)
        end = time.time()
        results.put(
            {
                "end": end,
                "batches": engine.seq + 1,
                "gaps": engine.gaps,
                "replayed": subscriber.replayed,
                "items": engine.embeds,
            }
        )


def _requests(tag: str, steps: int) -> list[Request]:
    return [
        Request(
            f"{tag}{n}",
            [
                MultiModalFeature(f"{tag}{n}.{i}", PlaceholderRange(i * ITEM_EMBEDS, ITEM_EMBEDS), "image")
                for i in range(ITEMS_PER_REQUEST)
            ],
        )
        for n in range(steps * (ITEMS_PER_STEP // ITEMS_PER_REQUEST))
    ]


def throughput(steps: int, watch: bool = False) -> dict[str, float]:
    """One throughput run of ``steps`` steps (see the module doc); with
    ``watch``, the publisher's thread drains the manager (the vLLM hook's way)."""
    directory = tempfile.mkdtemp(prefix="ec-bench-", dir="/tmp")
    endpoint, replay = f"ipc://{directory}/pub", f"ipc://{directory}/replay"
    context = multiprocessing.get_context("spawn")
    started, results = context.Event(), context.Queue()
    expected = context.Value("q", -1 if watch else steps)
    with EventPublisher(endpoint, replay_endpoint=replay, buffer_steps=steps + 1) as publisher:
        child = context.Process(target=_subscribe, args=(endpoint, replay, expected, started, results))
        child.start()
        try:
            if not started.wait(60):
                raise RuntimeError("the subscriber did not start")
            time.sleep(0.2)  # let the subscription reach the publisher
            if watch:
                manager = EncoderCacheManager(ITEMS_PER_STEP * ITEM_EMBEDS)
                publisher.watch(manager)
            else:
                manager = observed_class(EncoderCacheManager)(ITEMS_PER_STEP * ITEM_EMBEDS)
                manager.observers = StepObservers(publisher=publisher)
            per_step = ITEMS_PER_STEP // ITEMS_PER_REQUEST
            window = ITEMS_PER_REQUEST * ITEM_EMBEDS
            requests = _requests("r", steps)
            begin = time.time()
            cpu = time.process_time()
            stepped = time.perf_counter()
            it = iter(requests)
            for _ in range(steps):
                batch = [next(it) for _ in range(per_step)]
                for request in batch:
                    to_encode, *_ = manager.try_schedule_encoder_inputs(request, 0, window, 10**9)
                    manager.allocate_encoder_inputs(request, to_encode, [])
                manager.get_freed_mm_hashes()
                for request in batch:
                    manager.free(request)
            stepped = time.perf_counter() - stepped
            if watch:
                publisher.flush()
                expected.value = publisher.sent
            report = results.get(timeout=180)
            cpu = time.process_time() - cpu  # the manager's thread and the publisher's
        finally:
            child.join(30)
    elapsed = report["end"] - begin
    events = steps * ITEMS_PER_STEP + (steps - 1)  # the first step evicts nothing
    items = steps * ITEMS_PER_STEP + (steps - 1) * ITEMS_PER_STEP
    return {
        "steps": steps,
        "batches": report["batches"],
        "gaps": report["gaps"],
        "replayed": report["replayed"],
        "events_per_s": events / elapsed,
        "events_per_cpu_s": events / cpu,
        "items_per_s": items / elapsed,
        "step_us": stepped / steps * 1e6,
        "index_ok": report["items"] == sum(manager.num_embeds_by_hash.values()),
        # Messages that resent the whole state because the log overflowed between two drains.
        "resends": sum(wire.decode_batch(p)[1][:1] == [wire.cleared()] for _, p in publisher._ring),
    }


def _cpu_per_step(manager: Any, requests: list[Request], steps: int, publisher: Any = None) -> tuple[float, float]:
    """µs of CPU per step of the throughput loop: (this thread's, the other
    threads' until ``publisher`` has sent everything)."""
    per_step = ITEMS_PER_STEP // ITEMS_PER_REQUEST
    window = ITEMS_PER_REQUEST * ITEM_EMBEDS
    it = iter(requests)
    gc.collect()
    gc.disable()
    thread, process = time.thread_time(), time.process_time()
    try:
        for _ in range(steps):
            batch = [next(it) for _ in range(per_step)]
            for request in batch:
                to_encode, *_ = manager.try_schedule_encoder_inputs(request, 0, window, 10**9)
                manager.allocate_encoder_inputs(request, to_encode, [])
            manager.get_freed_mm_hashes()
            for request in batch:
                manager.free(request)
        thread = time.thread_time() - thread
        for _ in range(60_000):  # at most a minute
            if publisher is None or publisher.sent == publisher.published:
                break
            time.sleep(0.001)
        others = time.process_time() - process - thread
        return thread / steps * 1e6, others / steps * 1e6
    finally:
        gc.enable()


def hand_off(steps: int, rounds: int) -> dict[str, float]:
    """CPU per step of the throughput loop with events off and on (no
    subscriber), split between the scheduler's thread and the publisher's;
    each the fastest of ``rounds``."""
    directory = tempfile.mkdtemp(prefix="ec-bench-", dir="/tmp")
    off: list[float] = []
    on: list[tuple[float, float]] = []
    size = ITEMS_PER_STEP * ITEM_EMBEDS
    with EventPublisher(f"ipc://{directory}/pub") as publisher:
        for n in range(rounds):
            off.append(_cpu_per_step(EncoderCacheManager(size), _requests(f"a{n}.", steps), steps)[0])
            manager = observed_class(EncoderCacheManager)(size)
            manager.observers = StepObservers(publisher=publisher)
            on.append(_cpu_per_step(manager, _requests(f"b{n}.", steps), steps, publisher))
    return {
        "off_us": min(off),
        "on_scheduler_us": min(t for t, _ in on),
        "on_publisher_us": min(p for _, p in on),
    }


def bench_throughput_delivers_every_event() -> None:
    result = throughput(200)
    assert result["batches"] == 200
    assert result["index_ok"]


def bench_watched_manager_throughput_keeps_the_index_exact() -> None:
    result = throughput(200, watch=True)
    assert 1 <= result["batches"] <= 200 and result["gaps"] == 0
    assert result["index_ok"]


# --- vLLM's scheduler, events off and on -------------------------------------------


def _drain(endpoint: str, started: Any) -> None:
    """A subscriber process that receives and drops every message (at most 30 minutes)."""
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    started.set()
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if sub.poll(100):
            sub.recv_multipart()


def step_cost(rounds: int, model_seconds: float = 0.0) -> list[dict[str, Any]]:
    """Per workload: µs per step with events off and on (see the module doc),
    the scheduler's thread sleeping ``model_seconds`` after each ``schedule()``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_vllm_scheduler as sched
    import vllm_harness as harness

    rows = []
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as model_dir:
        model = harness.model_config(Path(model_dir))
        for workload, (setup, params) in sched.WORKLOADS.items():
            directory = tempfile.mkdtemp(prefix="ec-bench-", dir="/tmp")
            events = {"events_endpoint": f"ipc://{directory}/pub", "events_replay_endpoint": f"ipc://{directory}/r"}
            started = context.Event()
            child = context.Process(target=_drain, args=(events["events_endpoint"], started), daemon=True)
            child.start()
            started.wait(60)
            # "off again": the same as "off", measured beside it, so the table shows the harness's noise.
            steps: dict[str, list[list[int]]] = {"off": [], "on": [], "off again": []}
            batches = 0
            try:
                for _ in range(rounds):
                    for variant in steps:
                        scheduler = harness.build_scheduler(
                            "scheduler",
                            model,
                            setup,
                            manager_cls="encoder_cache.vllm.EncoderCacheManager",
                            manager_config=events if variant == "on" else {},
                        )
                        specs = harness.conversations(**params)
                        gc.collect()
                        gc.disable()
                        try:
                            run = harness.run(scheduler, specs, record=False, model_seconds=model_seconds)
                            steps[variant].append(run.step_ns)
                        finally:
                            gc.enable()
                        if variant == "on":
                            batches = scheduler.encoder_cache_manager.observers.events.published
                        scheduler.shutdown()
            finally:
                child.kill()
                child.join(10)
            means = {v: statistics.fmean(min(col) for col in zip(*runs)) / 1e3 for v, runs in steps.items()}
            rows.append(
                {
                    "workload": workload,
                    "steps": len(steps["off"][0]),
                    "batches": batches,
                    "off_us": means["off"],
                    "on_us": means["on"],
                    "change": means["on"] / means["off"] - 1,
                    "noise": means["off again"] / means["off"] - 1,
                }
            )
    return rows


def print_throughput(runs_count: int, steps: int) -> None:
    """The throughput and CPU-per-step tables."""
    runs = [throughput(steps) for _ in range(runs_count)]
    print(f"throughput ({runs_count} runs of {steps} steps x {ITEMS_PER_STEP} items; median, min-max):")
    for key, unit in (
        ("events_per_s", "events/s"),
        ("events_per_cpu_s", "events/CPU-s"),
        ("items_per_s", "items/s"),
        ("step_us", "µs per step"),
    ):
        values = [r[key] for r in runs]
        print(f"  {unit:>12}: {statistics.median(values):>12,.0f}  ({min(values):,.0f} - {max(values):,.0f})")
    print(
        f"  batches received {[r['batches'] for r in runs]}, gaps {[r['gaps'] for r in runs]}, index ok {all(r['index_ok'] for r in runs)}"
    )
    watched = [throughput(steps, watch=True) for _ in range(runs_count)]
    items = [r["items_per_s"] for r in watched]
    print(
        f"watched manager ({runs_count} runs): items/s {statistics.median(items):,.0f} ({min(items):,.0f} - "
        f"{max(items):,.0f}); messages {[r['batches'] for r in watched]}, of which whole-state resends "
        f"{[r['resends'] for r in watched]}; gaps {[r['gaps'] for r in watched]}; "
        f"index ok {all(r['index_ok'] for r in watched)}"
    )
    cost = hand_off(min(steps, 2000), runs_count)
    print(
        f"CPU per step (64 allocations, 64 evictions; fastest of {runs_count}): events off {cost['off_us']:.0f} µs; "
        f"on {cost['on_scheduler_us']:.0f} µs on the scheduler's thread + {cost['on_publisher_us']:.0f} µs "
        "on the publisher's"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="throughput runs (the median is shown)")
    parser.add_argument("--steps", type=int, default=5000, help="steps per throughput run")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the vLLM step comparison")
    parser.add_argument("--model-ms", type=float, default=2.0, help="model wait of the second step comparison (ms)")
    parser.add_argument("--skip-throughput", action="store_true", help="only the vLLM step comparison")
    args = parser.parse_args()
    if args.rounds < 1 or args.runs < 1 or args.steps < 2 or args.model_ms <= 0:
        parser.error("--runs and --rounds must be >= 1, --steps >= 2, --model-ms > 0")
    if not args.skip_throughput:
        print_throughput(args.runs, args.steps)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM not importable: no step-cost table")
        return
    for model_ms in (0.0, args.model_ms):
        wait = f"a {model_ms:g} ms model wait after each schedule()" if model_ms else "steps back to back"
        print(f"\nvLLM scheduler step (encoder_cache.vllm.Scheduler), events off vs on, {args.rounds} rounds, {wait}:")
        print("| workload | steps | batches | off µs/step | on µs/step | change | off again vs off |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for row in step_cost(args.rounds, model_ms / 1e3):
            print(
                f"| {row['workload']} | {row['steps']} | {row['batches']} | {row['off_us']:.1f} | {row['on_us']:.1f} "
                f"| {row['change']:+.1%} | {row['noise']:+.1%} |"
            )


if __name__ == "__main__":
    main()
