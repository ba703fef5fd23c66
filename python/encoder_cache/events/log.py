"""The events of one scheduler step, in the order the workers see them.

``StepEventLog`` is fed by the manager hook on the scheduler's thread:
``allocated(request, input_ids)`` at each allocation, ``cleared()`` at
``reset()``, and ``end_step(freed)`` once per step with what
``get_freed_mm_hashes()`` returned. Recording keeps references only (one list
append per allocation call); ``end_step`` hands back a ``StepRecord``, and the
publisher's thread turns it into the step's events (``StepRecord.events``):

1. ``EncoderCacheCleared`` if the cache was reset during the step;
2. ``EncoderCacheRemoved`` with the freed hashes (vLLM's workers drop them
   at the start of their next step, before encoding anything new);
3. ``EncoderCacheStored`` for each item allocated during the step and not
   among the freed ones, in the order of their first allocation.

This relies on the manager's report: ``get_freed_mm_hashes()`` leaves out the
hashes that are cached when it is called. So a freed hash is not cached, and
an item allocated in the step and freed is one that was evicted after its
allocation (its stored event is dropped); an item evicted and allocated again
in the step is not reported freed, and is stored. A consumer applying the
events in order holds exactly the manager's cached set after every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from encoder_cache.events import wire

__all__ = ["StepEventLog", "StepRecord"]


class StepRecord:
    """One step's raw record: reset or not, the freed hashes, the allocations
    (request, input ids). Reading the requests' features happens in ``events``."""

    __slots__ = ("allocations", "cleared", "freed", "medium")

    def __init__(self, cleared: bool, freed: list[str], allocations: list[tuple[Any, Sequence[int]]], medium: str):
        self.cleared = cleared
        self.freed = freed
        self.allocations = allocations
        self.medium = medium

    def events(self) -> list[dict[str, Any]]:
        """The step's events (see the module doc)."""
        medium = self.medium
        events: list[dict[str, Any]] = [wire.cleared()] if self.cleared else []
        freed = self.freed
        if freed:
            events.append(wire.removed(freed, medium))
        # hash -> (embeds, modality). An item allocated twice in the step (evicted
        # between) keeps its first place: no other event of the step names it.
        stored: dict[str, tuple[int, str]] = {}
        for request, input_ids in self.allocations:
            features = request.mm_features
            for input_id in input_ids:
                feature = features[input_id]
                stored[feature.identifier] = (
                    request.get_num_encoder_embeds(input_id),
                    getattr(feature, "modality", None) or "unknown",
                )
        if freed and stored:
            for mm_hash in stored.keys() & set(freed):
                del stored[mm_hash]  # evicted after its allocation
        kind = wire.STORED
        events.extend(
            {"type": kind, "hash": mm_hash, "embeds": embeds, "modality": modality, "medium": medium}
            for mm_hash, (embeds, modality) in stored.items()
        )
        return events


class StepEventLog:
    """The step's pending record (see the module doc); used by one thread, the scheduler's."""

    __slots__ = ("_allocations", "_cleared", "medium")

    def __init__(self, medium: str = wire.MEDIUM) -> None:
        self.medium = medium
        self._cleared = False
        self._allocations: list[tuple[Any, Sequence[int]]] = []

    def allocated(self, request: Any, input_ids: Sequence[int]) -> None:
        """The request's inputs ``input_ids`` were just allocated (the sequence is kept: pass one nobody changes)."""
        self._allocations.append((request, input_ids))

    def cleared(self) -> None:
        self._cleared = True
        self._allocations = []

    def end_step(self, freed: list[str]) -> StepRecord | None:
        """The step's record, or None if nothing changed; the log is then empty."""
        allocations = self._allocations
        if not (freed or allocations or self._cleared):
            return None
        # A copy: the scheduler passes the list it was given on to the workers.
        record = StepRecord(self._cleared, list(freed), allocations, self.medium)
        self._cleared = False
        self._allocations = []
        return record
