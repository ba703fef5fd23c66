"""The events of one scheduler step, in the order the workers see them.

``StepEventLog`` is fed by the manager hook: ``stored`` at each allocation,
``cleared`` at ``reset()``, and ``end_step(freed)`` with what
``get_freed_mm_hashes()`` returned, once per step. ``end_step`` returns the
step's events, ready to publish:

1. ``EncoderCacheCleared`` if the cache was reset during the step;
2. ``EncoderCacheRemoved`` with the freed hashes (vLLM's workers drop them
   at the start of their next step, before encoding anything new);
3. ``EncoderCacheStored`` for each item allocated during the step and still cached.

An item both allocated and freed during the step is settled by
``is_cached`` (asked only then): if it is cached now (an old entry was
evicted, then the item allocated again), it is removed then stored; if not (it
was allocated, released and evicted within the step, which vLLM's scheduler
never does) its stored event is dropped. So a consumer applying the events in
order holds exactly the manager's cached set after every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from encoder_cache.events import wire

__all__ = ["StepEventLog"]


class StepEventLog:
    """The step's pending events (see the module doc); used by one thread, the scheduler's."""

    __slots__ = ("_cleared", "_stored", "medium")

    def __init__(self, medium: str = wire.MEDIUM) -> None:
        self.medium = medium
        self._cleared = False
        # hash -> (embeds, modality), in allocation order; a re-allocation moves it last.
        self._stored: dict[str, tuple[int, str]] = {}

    def stored(self, mm_hash: str, embeds: int, modality: str) -> None:
        stored = self._stored
        stored.pop(mm_hash, None)
        stored[mm_hash] = (embeds, modality)

    def stored_inputs(self, request: Any, input_ids: Sequence[int]) -> None:
        """``stored`` for each of the request's inputs ``input_ids`` (just allocated)."""
        features = request.mm_features
        for input_id in input_ids:
            feature = features[input_id]
            self.stored(
                feature.identifier,
                request.get_num_encoder_embeds(input_id),
                getattr(feature, "modality", None) or "unknown",
            )

    def cleared(self) -> None:
        self._cleared = True
        self._stored.clear()

    def end_step(self, freed: list[str], is_cached: Callable[[str], bool]) -> list[dict[str, Any]]:
        """The step's events (see the module doc); the log is then empty."""
        events: list[dict[str, Any]] = []
        if self._cleared:
            events.append(wire.cleared())
            self._cleared = False
        stored = self._stored
        if freed:
            events.append(wire.removed(list(freed), self.medium))
            if stored:
                for mm_hash in set(freed).intersection(stored):
                    if not is_cached(mm_hash):
                        del stored[mm_hash]
        if stored:
            medium = self.medium
            events.extend(wire.stored(h, embeds, modality, medium) for h, (embeds, modality) in stored.items())
            stored.clear()
        return events
