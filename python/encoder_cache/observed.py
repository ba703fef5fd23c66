"""A manager that reports on itself once per scheduler step: log lines, Prometheus metrics, cache events.

The scheduler calls ``get_freed_mm_hashes()`` once at the end of every step;
that call is where ``StepObservers`` runs. Nothing is added to the per-item
calls except, with events on, the allocations (``allocate``,
``allocate_encoder_inputs``), which record what they stored in the step's
``StepEventLog``.

``observed_class(base, events=...)`` makes the class: ``base`` is a manager
class with vLLM 0.33's API (``encoder_cache.EncoderCacheManager`` or a
subclass); the instance's ``observers`` attribute holds what it reports to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from encoder_cache.events.log import StepEventLog

__all__ = ["StepObservers", "observed_class"]


class StepObservers:
    """What a manager reports once per step.

    - ``log``: called with ``stats()`` every ``log_interval`` seconds (0: never);
    - ``metrics``: a ``CacheMetrics`` updated at most every ``metrics_interval`` seconds;
    - ``publisher``: an ``EventPublisher`` given each step's events (steps without any publish nothing).
    """

    def __init__(
        self,
        *,
        log: Callable[[dict[str, Any]], None] | None = None,
        log_interval: float = 0.0,
        metrics: Any = None,
        metrics_interval: float = 1.0,
        publisher: Any = None,
    ) -> None:
        self.log = log if log_interval > 0 else None
        self.log_interval = log_interval
        self.metrics = metrics
        self.metrics_interval = metrics_interval
        self.publisher = publisher
        self.events = StepEventLog() if publisher is not None else None
        self._next_log = 0.0
        self._next_metrics = 0.0

    def end_step(self, manager: Any, freed: list[str]) -> None:
        events = self.events
        if events is not None:
            snapshot: list[dict[str, int]] = []

            def is_cached(mm_hash: str) -> bool:
                if not snapshot:
                    snapshot.append(manager.num_embeds_by_hash)
                return mm_hash in snapshot[0]

            batch = events.end_step(freed, is_cached)
            if batch:
                self.publisher.publish(batch)
        if self.log is None and self.metrics is None:
            return
        now = time.monotonic()
        if self.metrics is not None and now >= self._next_metrics:
            self._next_metrics = now + self.metrics_interval
            self.update_metrics(manager)
        if self.log is not None and now >= self._next_log:
            if self._next_log:
                self.log(manager.stats())
            self._next_log = now + self.log_interval

    def update_metrics(self, manager: Any) -> None:
        """Copy the manager's ``stats()`` into the metrics now."""
        self.metrics.update(manager.stats(), manager.cache_size)

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()


class _Observed:
    observers: StepObservers

    def get_freed_mm_hashes(self) -> list[str]:
        freed = super().get_freed_mm_hashes()  # type: ignore[misc]
        self.observers.end_step(self, freed)
        return freed

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        events = self.observers.events
        if events is not None:
            events.cleared()


class _Recording(_Observed):
    def allocate(self, request: Any, input_id: int) -> None:
        super().allocate(request, input_id)  # type: ignore[misc]
        self.observers.events.stored_inputs(request, (input_id,))  # type: ignore[union-attr]

    def allocate_encoder_inputs(
        self, request: Any, input_ids: Sequence[int], duplicate_input_ids: Sequence[int]
    ) -> None:
        super().allocate_encoder_inputs(request, input_ids, duplicate_input_ids)  # type: ignore[misc]
        if input_ids:
            self.observers.events.stored_inputs(request, input_ids)  # type: ignore[union-attr]


_CLASSES: dict[tuple[type, bool], type] = {}


def observed_class(base: type, *, events: bool) -> type:
    """``base`` reporting to its ``observers`` once per step; with ``events``,
    its allocations also record what they stored."""
    key = (base, events)
    cls = _CLASSES.get(key)
    if cls is None:
        mixin = _Recording if events else _Observed
        cls = _CLASSES[key] = type(f"Observed{base.__name__}", (mixin, base), {"__module__": base.__module__})
    return cls
