"""Publishes event batches over ZMQ from a background thread (see ``wire`` for the format).

The scheduler's side is ``publish(batch)``: one ``SimpleQueue.put`` of the
step's ``EventBatch`` (the manager's events, still Rust data), which never
waits. A daemon thread takes the batches in order, numbers them, encodes them
(``EventBatch.encode``: the payload's bytes are written in Rust, with no
Python object per event), sends each on the PUB socket without waiting (ZMQ
drops messages for a subscriber whose queue is at its high-water mark, so a
slow subscriber loses messages, never holds up a step) and keeps the last
``buffer_steps`` encoded batches in a ring for replay. Between batches it
answers replay requests on the ROUTER socket.

The queue between the two sides has no bound: the thread never waits on the
network, so it empties the queue as fast as it encodes (see BENCHMARKS.md,
"Cache events"); a step adds one object to it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from encoder_cache.events import wire

__all__ = ["EventPublisher", "binds", "engine_endpoint"]

_logger = logging.getLogger("vllm.encoder_cache")
_STOP = object()


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
    ROUTER bound to ``replay_endpoint``, sending the batches given to
    ``publish`` under ``topic``, numbered from 0.

    ``engine`` goes into every payload and ``medium`` into every stored and
    removed event; ``buffer_steps`` batches are kept for replay; ``hwm`` is
    the PUB socket's send high-water mark (messages queued per subscriber
    before ZMQ drops).
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
    ) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
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
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
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
        self._queue.put((time.time(), events))

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop the thread and close the sockets."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
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
        zmq = self._zmq
        get = self._queue.get
        pub, replay, ring = self._pub, self._replay, self._ring
        topic, engine, medium = self.topic, self.engine, self.medium
        poll = 0.05 if replay is not None else None
        while True:
            if replay is not None and replay.poll(0):
                try:
                    self._answer_replay()
                except Exception:  # a bad request must not stop the stream
                    _logger.exception("encoder cache events: a replay request failed")
            try:
                item = get(timeout=poll)
            except queue.Empty:
                continue
            if item is _STOP:
                return
            timestamp, events = item
            seq = self.sent
            self.sent = seq + 1
            try:
                if isinstance(events, list):
                    payload = wire.encode_batch(timestamp, events, engine)
                else:
                    payload = events.encode(timestamp, engine, medium)
            except Exception:
                # The number stays used and nothing is sent or kept: subscribers see a
                # gap no replay fills, and know their view of this engine is incomplete.
                _logger.exception("encoder cache events: could not build batch %d; it is lost", seq)
                continue
            ring.append((seq, payload))
            try:
                pub.send_multipart((topic, wire.encode_seq(seq), payload), flags=zmq.NOBLOCK, copy=False)
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
