"""Encoder-cache events: what an engine's cache stores and drops, published for routers.

- ``wire``: the format (vLLM's KV-event transport with encoder-cache event types);
- ``EventPublisher``: the engine's ZMQ publisher, sending from a background thread;
- ``CacheIndex`` / ``CacheEventSubscriber``: the reference consumer, one
  index of every engine's cached items, healed by replay, with ``score(items)``.

See docs/events.md. Publishing and subscribing need ``pyzmq`` and ``msgpack``
(``pip install 'encoder-cache[metrics]'``); importing this package does not.
"""

from encoder_cache.events import wire
from encoder_cache.events.index import CacheIndex, EngineCache
from encoder_cache.events.publisher import EventPublisher, engine_endpoint
from encoder_cache.events.subscriber import CacheEventSubscriber, Engine

__all__ = [
    "CacheEventSubscriber",
    "CacheIndex",
    "Engine",
    "EngineCache",
    "EventPublisher",
    "engine_endpoint",
    "wire",
]
