"""What each engine's encoder cache holds, rebuilt from its event batches.

``CacheIndex`` is the state alone (no sockets): ``apply(engine, seq, payload)``
takes one batch; batches must come in sequence order, and one that does not
follow the last applied is refused (``apply`` returns False) so the caller can
replay the missing ones first. ``score`` answers a router's question: for a
request's items, how many embeddings each engine already holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from encoder_cache.events import wire

__all__ = ["CacheIndex", "EngineCache"]


@dataclass
class EngineCache:
    """One engine's cached items as its events describe them."""

    #: hash -> (embeddings, modality)
    items: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Embeddings of all cached items.
    embeds: int = 0
    #: The last batch applied; -1 before the first.
    seq: int = -1
    #: Whether the items are known to be complete: batch 0 or a ``EncoderCacheCleared``
    #: has been applied, and no batch was lost for good since.
    complete: bool = False
    #: Batches that did not follow the last applied one (gaps seen).
    gaps: int = 0


class CacheIndex:
    """Engines' cached items, by engine name (any hashable the caller chooses)."""

    def __init__(self) -> None:
        self.engines: dict[object, EngineCache] = {}

    def engine(self, name: object) -> EngineCache:
        cache = self.engines.get(name)
        if cache is None:
            cache = self.engines[name] = EngineCache()
        return cache

    def expects(self, name: object) -> int:
        """The sequence number the engine's next batch should carry."""
        return self.engine(name).seq + 1

    def apply(self, name: object, seq: int, payload: bytes) -> bool:
        """Apply one batch of engine ``name``. A batch already applied is
        ignored (True); one past the next expected is refused (False)."""
        cache = self.engine(name)
        if seq <= cache.seq:
            return True
        if seq != cache.seq + 1:
            cache.gaps += 1
            return False
        _, events, _ = wire.decode_batch(payload)
        return self.apply_events(name, seq, events)

    def apply_events(self, name: object, seq: int, events: list[dict]) -> bool:
        """``apply`` for a batch already decoded (its ``events`` list), e.g. one
        that never left the process (the simulator's routers)."""
        cache = self.engine(name)
        if seq <= cache.seq:
            return True
        if seq != cache.seq + 1:
            cache.gaps += 1
            return False
        self._apply_events(cache, events)
        if seq == 0:
            cache.complete = True
        cache.seq = seq
        return True

    def skip_to(self, name: object, seq: int) -> None:
        """Accept that the batches before ``seq`` are lost for good: apply what
        comes next, and mark the engine incomplete until it clears."""
        cache = self.engine(name)
        if seq > cache.seq + 1:
            cache.seq = seq - 1
            cache.complete = False

    @staticmethod
    def _apply_events(cache: EngineCache, events: list[dict]) -> None:
        items = cache.items
        for event in events:
            kind = event.get("type")
            if kind == wire.STORED:
                old = items.get(event["hash"])
                if old is not None:
                    cache.embeds -= old[0]
                items[event["hash"]] = (event["embeds"], event.get("modality", "unknown"))
                cache.embeds += event["embeds"]
            elif kind == wire.REMOVED:
                for mm_hash in event["hashes"]:
                    old = items.pop(mm_hash, None)
                    if old is not None:
                        cache.embeds -= old[0]
            elif kind == wire.CLEARED:
                items.clear()
                cache.embeds = 0
                cache.complete = True
            # Unknown types are skipped: a newer publisher may add some.

    def score(self, items: Iterable[str]) -> dict[object, int]:
        """For each engine, the embeddings of ``items`` (hashes) it has cached."""
        wanted = list(dict.fromkeys(items))
        scores: dict[object, int] = {}
        for name, cache in self.engines.items():
            held = cache.items
            scores[name] = sum(held[h][0] for h in wanted if h in held)
        return scores
