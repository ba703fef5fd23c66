"""Publishes event batches over ZMQ from a background thread (see ``wire`` for the format).

Two ways in, both leaving the scheduler's thread nothing to do per step:

- ``watch(manager)``, as the vLLM hook runs it: the thread itself drains the
  manager's event log (``take_event_batch()``) every ``interval`` (50 ms by
  default), so each message carries the events of the steps of one interval,
  and the scheduler's thread only pays for the core's recording;
- ``publish(batch)``: a batch (an ``EventBatch`` or a list of event maps) is
  appended to a list, which never waits; the first batch after the thread
  has parked wakes it, it lets the batches of one ``interval`` gather, then
  sends them one message each.

Waking another Python thread once per step would cost the scheduler's thread
more than the events themselves (the wake-up and the hand-over of the GIL;
BENCHMARKS.md, "Cache events"), hence the interval. The thread numbers each
batch, encodes it (``EventBatch.encode``: the payload is written in Rust,
with no Python object per event) and sends it on the PUB socket without
waiting: ZMQ drops messages for a subscriber whose queue is at its
high-water mark, so a slow subscriber loses messages, never holds up a step.
The last ``buffer_steps`` encoded batches stay in a ring for replay; the
thread answers replay requests on the ROUTER socket between rounds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from encoder_cache.events import wire

__all__ = ["EventPublisher", "binds", "engine_endpoint"]

_logger = logging.getLogger("vllm.encoder_cache")


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:
        raise ImportError(f"encoder-cache events need pyzmq and msgpack: {wire.INSTALL_HINT}") from exc
    return zmq


def engine_endpoint(endpoint: str, engine: int) -> str:
    """The endpoint engine ``engine`` uses when several engines share one
    setting, as vLLM places its KV-event endpoints: a TCP port moves up by the
    index (port 0 and ``*`` are left to the system), an ``ipc://`` or
    ``inproc://`` path gets ``_dp<engine>`` appended; engine 0 keeps ``endpoint``."""
    if not engine:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint.rpartition(":")
        if not sep or host == "tcp" or not (port.isdigit() or port == "*"):
            raise ValueError(f"a tcp endpoint needs a port: {endpoint!r}")
        if port in ("*", "0"):
            return endpoint
        return f"{host}:{int(port) + engine}"
    return f"{endpoint}_dp{engine}"


def binds(endpoint: str) -> bool:
    """Whether the PUB socket binds ``endpoint`` (a wildcard host or port, an
    ``ipc://`` or ``inproc://`` path) rather than connecting to it, as vLLM's
    KV-event publisher decides."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class EventPublisher:
    """A PUB socket on ``endpoint`` (bound or connected, see ``binds``) and a
    ROUTER bound to ``replay_endpoint``, sending the batches of the watched
    manager and those given to ``publish`` under ``topic``, numbered from 0.

    ``engine`` goes into every payload and ``medium`` into every stored and
    removed event; ``buffer_steps`` batches are kept for replay; ``hwm`` is
    the PUB socket's send high-water mark (messages queued per subscriber
    before ZMQ drops); ``interval``, in seconds, is how often the thread
    drains a watched manager, and how long it lets published batches gather
    once woken (see the module doc).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = wire.DEFAULT_TOPIC,
        buffer_steps: int = 10_000,
        engine: int = 0,
        medium: str = wire.MEDIUM,
        hwm: int = 100_000,
        interval: float = 0.05,
    ) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        if not 0 <= interval <= 1:
            raise ValueError(f"interval must be between 0 and 1 second, got {interval}")
        zmq = _zmq()
        wire.codec()  # fail here, not in the thread, without a msgpack codec
        self.topic = topic.encode()
        self.engine = engine
        self.medium = medium
        self._zmq = zmq
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            if binds(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                # Room for a whole replay and its end marker, however slowly the client reads.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.bind(replay_endpoint)
        except Exception:
            self._close_sockets()
            raise
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode() if binds(endpoint) else endpoint
        self.replay_endpoint = None if self._replay is None else self._replay.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.interval = interval
        # Batches not yet taken by the thread, and whether the next publish must
        # wake it; both change under `_lock` (see `publish` and `_take`).
        self._pending: list[tuple[float, Any]] = []
        self._parked = True
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._source: Any = None
        self._rounds = 0  # rounds of the thread's loop finished
        #: Batches given to ``publish``, and batches sent so far (the next sequence number).
        self.published = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="encoder-cache-events", daemon=True)
        self._thread.start()

    def publish(self, events: Any) -> None:
        """Queue one batch: a step's ``EventBatch`` (``take_event_batch()``:
        anything with its ``encode(timestamp, engine, medium)``, encoded on
        the publisher's thread), or a list of event maps; returns at once."""
        self.published += 1
        with self._lock:
            self._pending.append((time.time(), events))
            if self._parked:
                self._parked = False
                self._wake.set()

    def watch(self, manager: Any) -> None:
        """Turn ``manager``'s events on and drain them from the publisher's
        thread every ``interval`` (``take_event_batch()``), until ``close``.

        The manager is called only while the thread holds the GIL; a drain
        that finds it borrowed all the same (PyO3's RuntimeError) waits for
        the next round.
        """
        if self._source is not None:
            raise ValueError("this publisher watches a manager already")
        if not self.interval:
            raise ValueError("a publisher that watches a manager needs an interval > 0 (it drains once per interval)")
        manager.enable_events()
        self._source = manager
        self._wake.set()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until the thread has sent every batch published before this
        call and what the watched manager recorded before it. Raises
        RuntimeError once the publisher is closed, TimeoutError if that takes
        longer than ``timeout`` seconds."""
        target = self._rounds + 2  # the round running now may have drained before this call
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self._rounds < target:
            if not self._thread.is_alive():
                raise RuntimeError("the event publisher is closed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the event publisher's thread did not finish a round in {timeout} s")
            self._wake.set()
            time.sleep(0.0005)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is pending (and what the watched manager still holds),
        stop the thread and close the sockets."""
        if self._thread.is_alive():
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
        self._close_sockets()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(0)
        self._context.term()

    def _run(self) -> None:
        replay = self._replay
        # With a replay socket and nothing watched, the thread looks for requests this often while parked.
        idle = 0.05 if replay is not None else None
        while True:
            source = self._source
            self._wake.wait(idle if source is None else self.interval)
            if replay is not None and replay.poll(0):
                try:
                    self._answer_replay()
                except Exception:  # a bad request must not stop the stream
                    _logger.exception("encoder cache events: a replay request failed")
            stopping = self._stopping
            if not stopping and source is None and self._pending and self.interval:
                time.sleep(self.interval)  # let this interval's batches gather
            for batch in self._take():
                self._send(*batch)
            if source is not None:
                self._drain(source)
            if stopping:
                return
            self._rounds += 1

    def _drain(self, source: Any) -> None:
        """Send what the watched manager recorded since the last drain."""
        try:
            batch = source.take_event_batch()
        except RuntimeError as exc:
            if "borrowed" not in str(exc):  # PyO3's words for a manager in use by another thread
                _logger.exception("encoder cache events: could not drain the manager")
            return  # the next round takes what is pending
        if batch is not None:
            self.published += 1
            self._send(time.time(), batch)

    def _take(self) -> list[tuple[float, Any]]:
        """Every pending batch, in order; the thread is parked from then on."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._parked = True
            self._wake.clear()
        return pending

    def _send(self, timestamp: float, events: Any) -> None:
        """Number, encode, keep and send one batch."""
        zmq = self._zmq
        seq = self.sent
        self.sent = seq + 1
        try:
            if isinstance(events, list):
                payload = wire.encode_batch(timestamp, events, self.engine)
            else:
                payload = events.encode(timestamp, self.engine, self.medium)
        except Exception:
            # The number stays used and nothing is sent or kept: subscribers see a
            # gap no replay fills, and know their view of this engine is incomplete.
            _logger.exception("encoder cache events: could not build batch %d; it is lost", seq)
            return
        self._ring.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic, wire.encode_seq(seq), payload), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass  # no room for a subscriber: it sees the gap and asks for a replay
        except zmq.ZMQError:
            _logger.exception("encoder cache events: could not send batch %d", seq)

    def _answer_replay(self) -> None:
        zmq = self._zmq
        replay = self._replay
        assert replay is not None
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            _logger.warning("encoder cache events: malformed replay request (%d frames) ignored", len(frames))
            return
        client, start = frames[0], int.from_bytes(frames[2], "big")
        topic = self.topic
        try:
            for seq, payload in self._ring:
                if seq >= start:
                    replay.send_multipart((client, b"", topic, wire.encode_seq(seq), payload), flags=zmq.NOBLOCK)
            replay.send_multipart((client, b"", b"", wire.END_SEQ, b""), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the client stopped reading; it will ask again
