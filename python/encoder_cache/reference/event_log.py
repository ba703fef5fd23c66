"""The twin's cache-event log, with the Rust core's behaviour (see
``EncoderCacheManager.enable_events``): storage recorded at each allocation,
removals equal to each ``get_freed_mm_hashes()`` report, a clear at
``reset()``, bounded by an overflow that turns the next drain into a clear and
every cached item."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_PENDING", "EventLog"]

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
