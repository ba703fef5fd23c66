"""The events of one scheduler step, in the order the workers see them.

The manager records them itself (``enable_events()``): what each allocation
stored, what each ``get_freed_mm_hashes()`` reported, and each ``reset()``.
Once per step, right after ``get_freed_mm_hashes()``, ``StepEventLog.end_step``
drains them (``take_step_events()``) into a ``StepRecord`` of plain data, and
the publisher's thread turns it into the step's events (``StepRecord.events``):

1. ``EncoderCacheCleared`` if the cache was reset during the step (or the
   manager's log overflowed, undrained);
2. ``EncoderCacheRemoved`` with the freed hashes (vLLM's workers drop them
   at the start of their next step, before encoding anything new);
3. ``EncoderCacheStored`` for each item allocated during the step and still
   cached, in the order of their first allocation (after an overflow, every
   cached item).

This relies on the manager's report: ``get_freed_mm_hashes()`` leaves out the
hashes that are cached when it is called. So an item evicted and allocated
again in the step is not reported freed, and is stored; one allocated and then
evicted is reported freed and not stored. A consumer applying the events in
order holds exactly the manager's cached set after every step.
"""

from __future__ import annotations

from typing import Any

from encoder_cache.events import wire

__all__ = ["StepEventLog", "StepRecord"]


class StepRecord:
    """One step's record: cleared or not, the freed hashes, the stored items
    ``(hash, embeds, modality)``; ``events`` builds the step's event maps."""

    __slots__ = ("cleared", "medium", "removed", "stored")

    def __init__(self, cleared: bool, removed: list[str], stored: list[tuple[str, int, str]], medium: str) -> None:
        self.cleared = cleared
        self.removed = removed
        self.stored = stored
        self.medium = medium

    def events(self) -> list[dict[str, Any]]:
        """The step's events (see the module doc)."""
        medium = self.medium
        events: list[dict[str, Any]] = [wire.cleared()] if self.cleared else []
        if self.removed:
            events.append(wire.removed(self.removed, medium))
        kind = wire.STORED
        events.extend(
            {"type": kind, "hash": mm_hash, "embeds": embeds, "modality": modality, "medium": medium}
            for mm_hash, embeds, modality in self.stored
        )
        return events


class StepEventLog:
    """Drains a manager's events once per step (see the module doc); used by
    one thread, the scheduler's."""

    __slots__ = ("medium",)

    def __init__(self, medium: str = wire.MEDIUM) -> None:
        self.medium = medium

    def end_step(self, manager: Any) -> StepRecord | None:
        """The step's record from ``manager.take_step_events()``, or None if nothing changed."""
        cleared, removed, stored = manager.take_step_events()
        if not (cleared or removed or stored):
            return None
        return StepRecord(cleared, removed, stored, self.medium)
