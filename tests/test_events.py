"""Encoder-cache events through real ZMQ sockets (ipc:// paths in a private
directory): the wire format, a step's event order, publish and subscribe,
gaps healed by replay, and the index against the manager's own cached set."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from observe_workload import make_request, pool, run_steps  # noqa: E402

from encoder_cache import EncoderCacheManager  # noqa: E402
from encoder_cache.events import (  # noqa: E402
    CacheEventSubscriber,
    CacheIndex,
    Engine,
    EventPublisher,
    engine_endpoint,
    wire,
)
from encoder_cache.observed import StepObservers, observed_class  # noqa: E402
from encoder_cache.reference.event_log import EventBatch  # noqa: E402

RecordingManager = observed_class(EncoderCacheManager)


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ec-ev-", dir="/tmp")  # ipc:// paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def endpoints(directory: str, name: str = "e") -> tuple[str, str]:
    return f"ipc://{directory}/{name}.pub", f"ipc://{directory}/{name}.replay"


class LossySubscriber(CacheEventSubscriber):
    """Loses the first arrival of each sequence number in ``drop`` on the PUB stream."""

    def __init__(self, *args: Any, drop: set[int] = frozenset(), **kwargs: Any) -> None:  # type: ignore[assignment]
        super().__init__(*args, **kwargs)
        self.drop = set(drop)
        self.dropped = 0

    def _receive(self, name: Any, seq: int, payload: bytes) -> int:
        if seq in self.drop:
            self.drop.discard(seq)
            self.dropped += 1
            return 0
        return super()._receive(name, seq, payload)


def publishing_manager(cache_size: int, publisher: EventPublisher) -> Any:
    manager = RecordingManager(cache_size)
    manager.observers = StepObservers(publisher=publisher)
    return manager


def catch_up(subscriber: CacheEventSubscriber, publisher: EventPublisher, name: Any = "e") -> None:
    """Poll until the publisher has sent everything and the subscriber applied it,
    replaying the tail (a lost last batch shows no gap); bounded."""
    publisher.flush()  # everything published so far is sent: a replay from here asks for no batch in flight
    for _ in range(200):
        subscriber.poll(0.02)
        if publisher.sent == publisher.published and subscriber.engine(name).seq == publisher.sent - 1:
            return
        if publisher.sent == publisher.published:
            subscriber.sync(name)
    raise AssertionError(f"not caught up: sent {publisher.sent}, applied up to {subscriber.engine(name).seq}")


def wait_sent(publisher: EventPublisher) -> None:
    """Wait (bounded) until the publisher's thread has sent every batch given to it."""
    for _ in range(500):
        if publisher.sent == publisher.published:
            return
        publisher._thread.join(0.01)
    raise AssertionError(f"the publisher sent {publisher.sent} of {publisher.published} batches")


def cached_items(manager: Any) -> dict[str, int]:
    return dict(manager.num_embeds_by_hash)


def index_items(subscriber: CacheEventSubscriber, name: Any = "e") -> dict[str, int]:
    return {h: embeds for h, (embeds, _) in subscriber.engine(name).items.items()}


# --- the wire format ---------------------------------------------------------


def test_a_batch_is_vllms_envelope_with_tagged_map_events() -> None:
    events = [wire.removed(["a", "b"]), wire.stored("c", 576, "image"), wire.cleared()]
    payload = wire.encode_batch(1700000000.5, events, 2)
    assert wire.codec().unpack(payload) == [
        1700000000.5,
        [
            {"type": "EncoderCacheRemoved", "hashes": ["a", "b"], "medium": "GPU"},
            {"type": "EncoderCacheStored", "hash": "c", "embeds": 576, "modality": "image", "medium": "GPU"},
            {"type": "EncoderCacheCleared"},
        ],
        2,
    ]
    assert wire.decode_batch(payload) == (1700000000.5, events, 2)
    assert wire.encode_seq(258) == b"\0\0\0\0\0\0\1\2"
    assert wire.decode_seq(wire.END_SEQ) == -1
    with pytest.raises(ValueError, match="8 bytes"):
        wire.decode_seq(b"\1")
    with pytest.raises(ValueError, match="event batch"):
        wire.decode_batch(wire.codec().pack({"not": "a batch"}))


def test_engine_endpoints_move_as_vllms_kv_event_endpoints() -> None:
    assert engine_endpoint("tcp://*:5570", 0) == "tcp://*:5570"
    assert engine_endpoint("tcp://*:5570", 3) == "tcp://*:5573"
    assert engine_endpoint("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert engine_endpoint("ipc:///run/ec", 1) == "ipc:///run/ec_dp1"
    with pytest.raises(ValueError, match="port"):
        engine_endpoint("tcp://host", 1)


# --- a step's events -----------------------------------------------------------


def test_a_step_reports_removals_before_storage() -> None:
    manager = EncoderCacheManager(16)
    manager.enable_events()
    old = make_request("o", [("old", 16, "audio")])
    manager.allocate(old, 0)
    manager.get_freed_mm_hashes()
    assert manager.take_event_batch().events() == [wire.stored("old", 16, "audio")]
    manager.free(old)
    new = make_request("r", [("new", 16, "image")])
    assert manager.can_allocate(new, 0, 100, 0)  # evicts old
    manager.allocate(new, 0)
    assert manager.get_freed_mm_hashes() == ["old"]
    batch = manager.take_event_batch()
    assert batch.events() == [wire.removed(["old"]), wire.stored("new", 16, "image")]
    assert len(batch) == 2 and repr(batch) == "EventBatch(cleared=False, removed=1, stored=1)"
    manager.get_freed_mm_hashes()
    assert manager.take_event_batch() is None, "a step that changed nothing has no batch"
    manager.reset()
    assert manager.take_event_batch().events("CPU") == [wire.cleared()]


@pytest.mark.parametrize("engine", [0, 127, 128, 70_000])
def test_a_batch_encodes_to_the_bytes_msgpack_makes(engine: int) -> None:
    """Every length class of msgpack's strings, arrays and integers: the Rust
    payload is byte for byte what msgpack packs from the same events."""
    msgpack = pytest.importorskip("msgpack")
    names = ["a", "h" * 31, "h" * 32, "h" * 255, "h" * 256, "h" * 70_000]
    sizes = [1, 127, 128, 255, 256, 65_535, 65_536, 1 << 32]
    manager = EncoderCacheManager(sum(sizes) + 100, policy="vllm")
    manager.enable_events()
    requests = [
        make_request(f"r{n}", [(f"{names[n % len(names)]}{n}", size, "video" if n % 2 else "image")])
        for n, size in enumerate(sizes)
    ]
    requests += [make_request(f"many{n}", [(f"m{n}", 1, "image")]) for n in range(20)]
    for request in requests:
        manager.allocate(request, 0)
    manager.get_freed_mm_hashes()
    batch = manager.take_event_batch()
    assert len(batch) == len(requests) == len(batch.events())
    assert batch.encode(1234.5, engine) == msgpack.packb([1234.5, batch.events(), engine], use_bin_type=True)
    for request in requests:
        manager.free(request)
    manager.cache_size = 0  # every entry evicted: one removal of all 28
    freed = manager.get_freed_mm_hashes()
    manager.reset()  # and a clear, which drops what was pending
    assert manager.take_event_batch().encode(0.0, engine, "CPU") == msgpack.packb(
        [0.0, [wire.cleared()], engine], use_bin_type=True
    )
    assert len(freed) == len(requests)


class Batches:
    """A publisher that keeps the batches it is given."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []

    def publish(self, record: Any) -> None:
        self.batches.append(record.events())


def recording_manager(cache_size: int) -> tuple[Any, Batches]:
    batches = Batches()
    manager = RecordingManager(cache_size)
    manager.observers = StepObservers(publisher=batches)
    return manager, batches


def schedule(manager: Any, request: Any) -> None:
    last = request.mm_features[-1].mm_position
    to_encode, _, _, _, repeated = manager.try_schedule_encoder_inputs(request, 0, last.offset + last.length, 100)
    manager.allocate_encoder_inputs(request, to_encode, repeated)


def test_an_item_evicted_and_stored_again_in_one_step_stays() -> None:
    """Evicted, then allocated again before the step ends: the manager no longer
    reports it freed (the workers keep it), and it is reported stored again."""
    manager, published = recording_manager(32)
    a = make_request("a", [("x", 16, "image")])
    schedule(manager, a)
    manager.get_freed_mm_hashes()
    manager.free(a)
    b = make_request("b", [("y", 32, "audio")])
    schedule(manager, b)  # evicts x
    manager.free(b)
    schedule(manager, make_request("a2", [("x", 16, "image")]))  # evicts y, stores x again
    assert manager.get_freed_mm_hashes() == ["y"]
    assert published.batches == [
        [wire.stored("x", 16, "image")],
        [wire.removed(["y"]), wire.stored("x", 16, "image")],
    ]
    assert set(manager.num_embeds_by_hash) == {"x"}


def test_an_item_stored_and_evicted_in_one_step_is_not_reported_stored() -> None:
    """Allocated, released and evicted before the step ends (vLLM's scheduler
    never does this; the manager allows it): removed only."""
    manager, published = recording_manager(32)
    a = make_request("a", [("x", 16, "image")])
    schedule(manager, a)
    manager.free(a)
    schedule(manager, make_request("b", [("y", 32, "audio")]))  # evicts x in the same step
    assert manager.get_freed_mm_hashes() == ["x"]
    assert published.batches == [[wire.removed(["x"]), wire.stored("y", 32, "audio")]]


def test_reset_clears_first_and_forgets_earlier_storage() -> None:
    manager, published = recording_manager(64)
    schedule(manager, make_request("a", [("x", 16, "image")]))
    manager.reset()
    manager.allocate(make_request("b", [("y", 8, "video")]), 0)  # the per-item path records too
    manager.get_freed_mm_hashes()
    manager.get_freed_mm_hashes()  # a step that changed nothing publishes nothing
    assert published.batches == [[wire.cleared(), wire.stored("y", 8, "video")]]


# --- through the sockets -------------------------------------------------------


def test_publish_subscribe_gap_and_replay(ipc_dir: str) -> None:
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with (
        EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint, engine=4) as publisher,
        LossySubscriber({"e": Engine(pub_endpoint, replay_endpoint)}, drop={3, 4, 9}) as subscriber,
    ):
        subscriber.sync("e")  # the subscription is up before the first batch is missed
        manager = publishing_manager(96, publisher)
        for seed in range(6):
            run_steps(manager, 5, seed=seed)
            subscriber.poll(0.01)
        catch_up(subscriber, publisher)
        assert subscriber.dropped == 3  # the loss really happened ...
        assert subscriber.replays >= 1 and subscriber.replayed >= 3  # ... and replay healed it
        engine = subscriber.engine("e")
        assert engine.complete and engine.gaps >= 1
        assert index_items(subscriber) == cached_items(manager)
        assert engine.embeds == sum(cached_items(manager).values())
        assert {m for _, m in engine.items.values()} <= {"image", "audio", "video"}


def test_a_watched_manager_is_drained_by_the_publishers_thread(ipc_dir: str) -> None:
    """The vLLM hook's way: a plain manager (no per-step hook) whose log the
    publisher's thread drains; steps taken in bursts between its rounds, and
    a subscriber that misses messages, still end with the manager's cached set."""
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with (
        EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint, interval=0.002) as publisher,
        LossySubscriber({"e": Engine(pub_endpoint, replay_endpoint)}, drop={1, 4}) as subscriber,
    ):
        subscriber.sync("e")
        manager = EncoderCacheManager(96)
        publisher.watch(manager)
        assert manager.take_step_events() == (False, [], []), "watch() turned the manager's events on"
        for seed in range(12):
            run_steps(manager, 4, seed=seed)
            time.sleep(0.004 if seed % 2 else 0)
            subscriber.poll(0.001)
        publisher.flush()
        assert publisher.published == publisher.sent >= 6, "the thread drains in rounds, one message each"
        catch_up(subscriber, publisher)
        assert subscriber.dropped == 2 and subscriber.replays >= 1
        assert subscriber.engine("e").complete
        assert index_items(subscriber) == cached_items(manager)
        with pytest.raises(ValueError, match="watches a manager already"):
            publisher.watch(manager)


class BusyOnce:
    """A manager the scheduler's thread holds at the first drain (PyO3 raises RuntimeError)."""

    def __init__(self) -> None:
        self.calls = 0
        self.enabled = False

    def enable_events(self) -> None:
        self.enabled = True

    def take_event_batch(self) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("Already mutably borrowed")
        return EventBatch(False, [], [("a", 4, "image")]) if self.calls == 2 else None


def test_a_drain_that_finds_the_manager_busy_waits_for_the_next_round(ipc_dir: str) -> None:
    with EventPublisher(f"ipc://{ipc_dir}/p", interval=0.001) as publisher:
        source = BusyOnce()
        publisher.watch(source)
        publisher.flush()
        publisher.flush()
        assert source.enabled and source.calls >= 3
        assert publisher.sent == publisher.published == 1


def test_close_drains_the_watched_manager(ipc_dir: str) -> None:
    """A long interval: what the manager recorded since the last round goes out at close()."""
    publisher = EventPublisher(f"ipc://{ipc_dir}/p", interval=1.0)
    manager = EncoderCacheManager(96)
    publisher.watch(manager)
    publisher.flush()  # the first rounds, right after watch()
    run_steps(manager, 3, seed=1)
    publisher.close()
    assert manager.take_event_batch() is None, "close() took everything"
    with pytest.raises(RuntimeError, match="closed"):
        publisher.flush()
    index = CacheIndex()
    for seq, payload in publisher._ring:
        index.apply_events("e", seq, wire.decode_batch(payload)[1])
    assert publisher.sent >= 1 and {h: n for h, (n, _) in index.engine("e").items.items()} == cached_items(manager)


def test_a_late_subscriber_learns_the_past_by_replay(ipc_dir: str) -> None:
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint) as publisher:
        manager = publishing_manager(96, publisher)
        run_steps(manager, 20, seed=1)
        with CacheEventSubscriber({"e": Engine(pub_endpoint, replay_endpoint)}) as subscriber:
            catch_up(subscriber, publisher)
            assert subscriber.engine("e").complete
            assert index_items(subscriber) == cached_items(manager)


def test_batches_older_than_the_ring_are_lost_until_a_clear(ipc_dir: str) -> None:
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint, buffer_steps=4) as publisher:
        manager = publishing_manager(96, publisher)
        run_steps(manager, 20, seed=1)
        wait_sent(publisher)  # all gone before the subscriber connects
        with CacheEventSubscriber({"e": Engine(pub_endpoint, replay_endpoint)}) as subscriber:
            catch_up(subscriber, publisher)
            engine = subscriber.engine("e")
            assert not engine.complete  # only the last 4 batches could be replayed
            manager.reset()
            run_steps(manager, 5, seed=2)
            catch_up(subscriber, publisher)
            assert engine.complete
            assert index_items(subscriber) == cached_items(manager)


def test_a_stalled_subscriber_never_holds_the_publisher(ipc_dir: str) -> None:
    """A subscriber that reads nothing while 3,000 batches go out: the publisher
    sends them all regardless (ZMQ drops past the high-water mark); the
    subscriber then heals by replay."""
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    publisher = EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint, hwm=50, buffer_steps=5000)
    try:
        with CacheEventSubscriber({"e": Engine(pub_endpoint, replay_endpoint)}) as subscriber:
            subscriber.sync("e")
            subscriber._subs["e"].setsockopt(zmq.RCVHWM, 50)
            for n in range(3000):
                publisher.publish([wire.stored(f"h{n}", 1, "image")])
            wait_sent(publisher)  # while the subscriber reads nothing
            catch_up(subscriber, publisher)
            assert subscriber.replays >= 1
            assert len(subscriber.engine("e").items) == 3000
    finally:
        publisher.close()


@pytest.mark.parametrize("interval", [0.0, 0.005])
def test_a_parked_publisher_wakes_for_each_later_batch(ipc_dir: str, interval: float) -> None:
    """Without a replay socket the thread waits for nothing but a publish: every
    batch published after it parked (one at a time, or while it is sending) goes out."""
    publisher = EventPublisher(f"ipc://{ipc_dir}/p", interval=interval)
    try:
        for round_ in range(20):
            for n in range(round_ % 3 + 1):
                publisher.publish([wire.stored(f"h{round_}.{n}", 1, "image")])
            wait_sent(publisher)
        total = sum(round_ % 3 + 1 for round_ in range(20))
        assert publisher.sent == publisher.published == total
        assert [seq for seq, _ in publisher._ring] == list(range(total))
    finally:
        publisher.close()


def test_close_sends_what_is_pending(ipc_dir: str) -> None:
    """A long interval: close() does not wait it out, and what was published still goes out."""
    publisher = EventPublisher(f"ipc://{ipc_dir}/p", interval=1.0)
    for n in range(5):
        publisher.publish([wire.stored(f"h{n}", 1, "image")])
    began = time.monotonic()
    publisher.close()
    assert publisher.sent == 5
    assert time.monotonic() - began < 0.9, "close() cut the interval short"


def test_a_bad_interval_is_refused(ipc_dir: str) -> None:
    with pytest.raises(ValueError, match="interval"):
        EventPublisher(f"ipc://{ipc_dir}/p", interval=-1)
    with EventPublisher(f"ipc://{ipc_dir}/p", interval=0) as publisher:
        manager = EncoderCacheManager(8)
        with pytest.raises(ValueError, match="interval > 0"):
            publisher.watch(manager)
        with pytest.raises(ValueError, match="events are off"):
            manager.take_event_batch()  # refused before it changed anything


def test_a_batch_that_cannot_be_built_is_a_gap_no_replay_fills(ipc_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    """The stream goes on, and subscribers learn their view is incomplete."""
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with (
        EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint) as publisher,
        CacheEventSubscriber({"e": Engine(pub_endpoint, replay_endpoint)}) as subscriber,
    ):
        subscriber.sync("e")
        publisher.publish([wire.stored("a", 1, "image")])
        publisher.publish(EventBatch(False, [], [(object(), 1, "image")]))  # not encodable
        publisher.publish([wire.stored("b", 2, "image")])
        catch_up(subscriber, publisher)
        engine = subscriber.engine("e")
        assert engine.seq == 2 and not engine.complete
        assert set(engine.items) == {"a", "b"}
    assert "could not build batch 1" in caplog.text


def test_an_engine_can_connect_to_a_binding_subscriber(ipc_dir: str) -> None:
    """A tcp endpoint without a wildcard is connected to, as vLLM's publisher does; the router binds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint, replay = f"tcp://127.0.0.1:{port}", endpoints(ipc_dir)[1]
    with CacheEventSubscriber({"e": Engine(endpoint, replay, bind=True)}) as subscriber:
        with EventPublisher(endpoint, replay_endpoint=replay) as publisher:
            assert publisher.endpoint == endpoint
            publisher.publish([wire.stored("x", 3, "image")])
            catch_up(subscriber, publisher)
        assert subscriber.engine("e").items == {"x": (3, "image")}


def test_the_command_line_watcher_prints_replayed_and_live_batches(ipc_dir: str) -> None:
    pub_endpoint, replay_endpoint = endpoints(ipc_dir)
    with EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint, engine=2) as publisher:
        publisher.publish([wire.stored("x", 3, "image")])
        wait_sent(publisher)
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "encoder_cache.events",
                pub_endpoint,
                "--replay",
                replay_endpoint,
                "--batches",
                "2",
                "--seconds",
                "60",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            first = json.loads(watcher.stdout.readline())  # the replayed batch
            for _ in range(100):  # the live one, once the subscription is up
                publisher.publish([wire.removed(["x"])])
                if watcher.poll() is not None:
                    break
                time.sleep(0.05)
            lines = watcher.communicate(timeout=60)[0].splitlines()
        finally:
            watcher.kill()
    assert first == {"seq": 0, "timestamp": first["timestamp"], "engine": 2, "events": [wire.stored("x", 3, "image")]}
    second = json.loads(lines[0])
    assert second["seq"] >= 1 and second["events"] == [wire.removed(["x"])]


def test_score_counts_each_engines_cached_embeddings(ipc_dir: str) -> None:
    a_pub, a_replay = endpoints(ipc_dir, "a")
    b_pub, b_replay = endpoints(ipc_dir, "b")
    with (
        EventPublisher(a_pub, replay_endpoint=a_replay) as pub_a,
        EventPublisher(b_pub, replay_endpoint=b_replay, engine=1) as pub_b,
        CacheEventSubscriber({"a": Engine(a_pub, a_replay), "b": Engine(b_pub, b_replay)}) as subscriber,
    ):
        pub_a.publish([wire.stored("x", 10, "image"), wire.stored("y", 20, "image")])
        pub_b.publish([wire.stored("y", 20, "image"), wire.stored("z", 40, "audio")])
        pub_b.publish([wire.removed(["y"])])
        catch_up(subscriber, pub_a, "a")
        catch_up(subscriber, pub_b, "b")
        assert subscriber.score(["x", "y", "z", "x"]) == {"a": 30, "b": 40}
        assert subscriber.score([]) == {"a": 0, "b": 0}
        assert subscriber.engine("b").embeds == 40


def test_index_refuses_out_of_order_batches() -> None:
    index = CacheIndex()
    one = wire.encode_batch(0.0, [wire.stored("x", 1, "image")], 0)
    assert not index.apply("e", 1, one)  # batch 0 is missing
    assert index.engine("e").gaps == 1 and index.engine("e").items == {}
    assert index.apply("e", 0, wire.encode_batch(0.0, [], 0))
    assert index.apply("e", 1, one) and index.apply("e", 1, one)  # the repeat is ignored
    assert index.engine("e").items == {"x": (1, "image")}


# --- the property: the index is the manager's cached set ------------------------

ITEMS = pool(11, size=12)
operation = st.one_of(
    st.tuples(st.just("schedule"), st.lists(st.integers(0, 11), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("per_item"), st.lists(st.integers(0, 11), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("finish"), st.integers(0, 1000)),
    st.tuples(st.just("step"), st.just(0)),
    st.tuples(st.just("reset"), st.just(0)),
    st.tuples(st.just("resize"), st.integers(40, 120)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.one_of(operation, st.just(("step", 0))), min_size=5, max_size=60),
    drop=st.sets(st.integers(0, 12), max_size=6),
)
def test_index_equals_the_managers_cached_set(ipc_dir: str, ops: list[tuple[str, Any]], drop: set[int]) -> None:
    """Random manager operations, a subscriber that loses batches, replay: the
    index holds exactly the manager's cached items and sizes."""
    pub_endpoint, replay_endpoint = endpoints(ipc_dir, f"p{len(ops)}-{len(drop)}")
    with (
        EventPublisher(pub_endpoint, replay_endpoint=replay_endpoint) as publisher,
        LossySubscriber({"e": Engine(pub_endpoint, replay_endpoint)}, drop=drop) as subscriber,
    ):
        subscriber.sync("e")
        manager = publishing_manager(64, publisher)
        live: list[Any] = []
        for n, (op, arg) in enumerate(ops):
            if op in ("schedule", "per_item"):
                request = make_request(f"r{n}", [ITEMS[i] for i in arg])
                if op == "schedule":
                    last = request.mm_features[-1].mm_position
                    to_encode, _, _, _, repeated = manager.try_schedule_encoder_inputs(
                        request, 0, last.offset + last.length, 10**6
                    )
                    manager.allocate_encoder_inputs(request, to_encode, repeated)
                else:  # vLLM's own per-item loop, as with the manager switch alone
                    for i in range(len(arg)):
                        if not manager.check_and_update_cache(request, i) and manager.can_allocate(
                            request, i, 10**6, 0
                        ):
                            manager.allocate(request, i)
                live.append(request)
            elif op == "finish" and live:
                manager.free(live.pop(arg % len(live)))
            elif op == "step":
                manager.get_freed_mm_hashes()
                subscriber.poll(0.0)
            elif op == "reset":
                manager.reset()
                live.clear()
            elif op == "resize":
                with contextlib.suppress(ValueError):  # the entries in use would not fit: nothing changed
                    manager.cache_size = arg
        manager.get_freed_mm_hashes()
        catch_up(subscriber, publisher)
        assert index_items(subscriber) == cached_items(manager)
        assert subscriber.engine("e").complete or publisher.sent == 0  # nothing published, nothing known
        event(f"batches lost and replayed: {'yes' if subscriber.dropped else 'no'}")


# --- against vLLM's own code -----------------------------------------------------


@pytest.mark.vllm
def test_vllms_batch_decoder_reads_our_payload() -> None:
    """vLLM's EventBatch (msgspec, array-like) decodes our envelope; events stay maps tagged by "type"."""
    pytest.importorskip("vllm")
    import msgspec
    from vllm.distributed.kv_events import EventBatch

    events = [wire.stored("c", 576, "image"), wire.removed(["a"])]
    batch = msgspec.msgpack.Decoder(type=EventBatch).decode(wire.encode_batch(12.5, events, 3))
    assert (batch.ts, batch.events, batch.data_parallel_rank) == (12.5, events, 3)


@pytest.mark.vllm
def test_our_subscriber_follows_vllms_kv_event_publisher(ipc_dir: str) -> None:
    """vLLM's own ZmqEventPublisher, lossy delivery healed through its replay
    socket by our subscriber: the transport is the same. Its KV event types
    are not ours, so the index stays empty while the sequence advances."""
    pytest.importorskip("vllm")
    from vllm.distributed.kv_events import AllBlocksCleared, KVEventBatch, ZmqEventPublisher

    pub_endpoint, replay_endpoint = endpoints(ipc_dir, "kv")
    publisher = ZmqEventPublisher(0, endpoint=pub_endpoint, replay_endpoint=replay_endpoint, topic="kv")
    try:
        with LossySubscriber({"e": Engine(pub_endpoint, replay_endpoint)}, topic="kv", drop={1, 2}) as sub:
            sub.sync("e")
            for n in range(6):
                publisher.publish(KVEventBatch(ts=float(n), events=[AllBlocksCleared()]))
            for _ in range(200):
                sub.poll(0.02)
                if sub.engine("e").seq == 5:
                    break
            assert sub.engine("e").seq == 5 and sub.dropped == 2 and sub.replays >= 1
    finally:
        publisher.shutdown()
