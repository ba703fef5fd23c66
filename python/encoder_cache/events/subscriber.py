"""A router's view of several engines' encoder caches, kept from their event streams.

``CacheEventSubscriber`` subscribes (SUB) to each engine's publisher, applies
the batches to a ``CacheIndex`` and heals gaps: when a batch arrives that does
not follow the last one applied (a subscriber too slow for the publisher's
high-water mark, a late start), it asks the engine's replay socket (DEALER)
for everything from the first missing number, applies the replayed batches,
then the one that revealed the gap. A batch the replay ring no longer holds is
lost for good: the engine is marked incomplete (``EngineCache.complete``)
until it publishes ``EncoderCacheCleared``.

Everything happens in the caller's thread, in ``poll``; every wait is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from encoder_cache.events import wire
from encoder_cache.events.index import CacheIndex, EngineCache
from encoder_cache.events.publisher import _zmq

__all__ = ["CacheEventSubscriber", "Engine"]


@dataclass(frozen=True)
class Engine:
    """Where one engine publishes: its PUB endpoint and, optionally, its replay
    endpoint. With ``bind``, the subscriber binds ``endpoint`` and the engine
    connects to it (an ``events_endpoint`` without a wildcard, e.g.
    ``tcp://router:5570``)."""

    endpoint: str
    replay_endpoint: str | None = None
    bind: bool = False


class CacheEventSubscriber:
    """Subscribes to ``engines`` (name -> ``Engine``) on ``topic``; see the module doc."""

    def __init__(
        self,
        engines: Mapping[Any, Engine],
        *,
        topic: str = wire.DEFAULT_TOPIC,
        replay_timeout: float = 2.0,
    ) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self.index = CacheIndex()
        self.replay_timeout = replay_timeout
        #: Replays requested, and batches received through them.
        self.replays = 0
        self.replayed = 0
        self._topic = topic.encode()
        self._context = zmq.Context()
        self._poller = zmq.Poller()
        self._subs: dict[Any, Any] = {}
        self._names: dict[Any, Any] = {}
        self._engines = dict(engines)
        for name, engine in self._engines.items():
            sub = self._context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            if engine.bind:
                sub.bind(engine.endpoint)
            else:
                sub.connect(engine.endpoint)
            self._subs[name] = sub
            self._names[sub] = name
            self._poller.register(sub, zmq.POLLIN)
            self.index.engine(name)

    def close(self) -> None:
        for sock in self._subs.values():
            sock.close(0)
        self._context.term()

    def __enter__(self) -> CacheEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def engine(self, name: Any) -> EngineCache:
        return self.index.engine(name)

    def score(self, items: Iterable[str]) -> dict[Any, int]:
        """For each engine, the embeddings of ``items`` (hashes) it has cached."""
        return self.index.score(items)

    def poll(self, timeout: float = 0.0, max_batches: int = 10_000) -> int:
        """Apply the batches that arrive within ``timeout`` seconds (at most
        ``max_batches``), healing gaps; returns how many were applied."""
        zmq = self._zmq
        applied = 0
        wait_ms = int(timeout * 1000)
        while applied < max_batches:
            ready = dict(self._poller.poll(wait_ms))
            if not ready:
                break
            wait_ms = 0
            for sock in ready:
                name = self._names[sock]
                while applied < max_batches:
                    try:
                        frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 3:  # (topic, sequence, payload)
                        applied += self._receive(name, wire.decode_seq(frames[1]), frames[2])
        return applied

    def sync(self, name: Any) -> int:
        """Replay engine ``name`` from its next expected batch (e.g. right after
        subscribing, to learn what was published before); returns the batches applied."""
        return self._replay(name, self.index.expects(name))

    def _receive(self, name: Any, seq: int, payload: bytes) -> int:
        index = self.index
        if index.apply(name, seq, payload):
            return 1
        applied = self._replay(name, index.expects(name))
        if not index.apply(name, seq, payload):
            index.skip_to(name, seq)  # the ring no longer holds the missing batches
            index.apply(name, seq, payload)
        return applied + 1

    def _replay(self, name: Any, start: int) -> int:
        """Ask the engine's replay socket for the batches from ``start`` and apply them in order."""
        engine = self._engines[name]
        if engine.replay_endpoint is None:
            return 0
        zmq = self._zmq
        self.replays += 1
        applied = 0
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(engine.replay_endpoint)
            dealer.send_multipart((b"", wire.encode_seq(start)))
            timeout_ms = int(self.replay_timeout * 1000)
            while dealer.poll(timeout_ms):
                # (empty delimiter, topic, sequence, payload); the end: sequence -1, empty payload.
                frames = dealer.recv_multipart()
                if len(frames) != 4:
                    break
                seq = wire.decode_seq(frames[2])
                if seq < 0:
                    break
                self.replayed += 1
                if not self.index.apply(name, seq, frames[3]):
                    # The ring starts after the missing batch: lost for good.
                    self.index.skip_to(name, seq)
                    self.index.apply(name, seq, frames[3])
                applied += 1
        finally:
            dealer.close(0)
        return applied
