"""The twin's cache-event log, with the Rust core's behaviour (see
``EncoderCacheManager.enable_events``): storage recorded at each allocation,
removals equal to each ``get_freed_mm_hashes()`` report, a clear at
``reset()``, bounded by an overflow that turns the next drain into a clear and
every cached item; ``EventBatch``, one drain as the Rust ``EventBatch`` gives it."""

from __future__ import annotations

from typing import Any

from encoder_cache.events import wire

__all__ = ["DEFAULT_MAX_PENDING", "EventBatch", "EventLog"]

#: Pending identifiers a log keeps by default before it overflows.
DEFAULT_MAX_PENDING = 1 << 16


class EventLog:
    """What a manager recorded since the last drain."""

    __slots__ = ("cleared", "max_pending", "overflowed", "removed", "stored")

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.cleared = False
        self.overflowed = False
        self.removed: list[str] = []
        self.stored: list[str] = []

    def set_max_pending(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._check_bound()

    def record_stored(self, mm_hash: str) -> None:
        if not self.overflowed:
            self.stored.append(mm_hash)
            self._check_bound()

    def record_removed(self, hashes: list[str]) -> None:
        if not self.overflowed and hashes:
            self.removed.extend(hashes)
            self._check_bound()

    def record_cleared(self) -> None:
        self.cleared = True
        self.overflowed = False
        self.removed = []
        self.stored = []

    def drain(self) -> tuple[bool, bool, list[str], list[str]]:
        """``(overflowed, cleared, removed, stored)``; the log is then empty."""
        drained = (self.overflowed, self.cleared, self.removed, self.stored)
        self.overflowed = self.cleared = False
        self.removed = []
        self.stored = []
        return drained

    def _check_bound(self) -> None:
        if len(self.removed) + len(self.stored) > self.max_pending:
            self.overflowed = True
            self.removed = []
            self.stored = []


class EventBatch:
    """One drain: cleared or not, the removed identifiers, the stored items
    ``(identifier, embeds, modality)``, with the Rust ``EventBatch``'s methods."""

    __slots__ = ("cleared", "removed", "stored")

    def __init__(self, cleared: bool, removed: list[str], stored: list[tuple[str, int, str]]) -> None:
        self.cleared = cleared
        self.removed = removed
        self.stored = stored

    def events(self, medium: str = wire.MEDIUM) -> list[dict[str, Any]]:
        """The event maps: cleared, then removed, then one per stored item."""
        events = [wire.cleared()] if self.cleared else []
        if self.removed:
            events.append(wire.removed(list(self.removed), medium))
        events.extend(wire.stored(mm_hash, embeds, modality, medium) for mm_hash, embeds, modality in self.stored)
        return events

    def encode(self, timestamp: float, engine: int, medium: str = wire.MEDIUM) -> bytes:
        """The message payload of ``events(medium)`` (``wire.encode_batch``)."""
        return wire.encode_batch(timestamp, self.events(medium), engine)

    def __len__(self) -> int:
        return int(self.cleared) + bool(self.removed) + len(self.stored)
