"""What a manager reports: log lines and Prometheus metrics once per scheduler step, cache events.

The scheduler calls ``get_freed_mm_hashes()`` once at the end of every step;
that call runs ``StepObservers.end_step`` as the manager's step hook
(``set_step_hook``) whenever its log line, metrics update or publisher is
due, and a step with nothing due pays for a clock read in Rust. Nothing is
added to the per-item calls. Cache events need no per-step call
at all: the manager's core records what it stores, drops and clears
(``enable_events()``), and an ``EventPublisher`` that watches the manager
drains that from its own thread (``StepObservers.events``). A per-step
consumer (``StepObservers.publisher``, as the simulator's replicas use) is
given each step's ``EventBatch`` at the step's end instead.

``observed_class(base)`` makes the class: ``base`` is a manager class with
vLLM 0.33's API (``encoder_cache.EncoderCacheManager`` or a subclass); the
instance's ``observers`` attribute holds what it reports to, and assigning
observers with a publisher turns the manager's events on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from encoder_cache.events import wire

__all__ = ["OBSERVE_KEYS", "ObserveOptions", "StepObservers", "observed_class"]


class StepObservers:
    """What a manager reports once per step.

    - ``log``: called with ``stats()`` every ``log_interval`` seconds (0: never);
    - ``metrics``: a ``CacheMetrics`` updated at most every ``metrics_interval`` seconds;
    - ``publisher``: anything with ``publish``, given each step's
      ``EventBatch`` (``take_event_batch()``) at the step's end; steps that
      changed nothing publish nothing;
    - ``events``: an ``EventPublisher`` that watches the manager from its own
      thread (``EventPublisher.watch``), closed with the observers.
    """

    def __init__(
        self,
        *,
        log: Callable[[dict[str, Any]], None] | None = None,
        log_interval: float = 0.0,
        metrics: Any = None,
        metrics_interval: float = 1.0,
        publisher: Any = None,
        events: Any = None,
    ) -> None:
        self.log = log if log_interval > 0 else None
        self.log_interval = log_interval
        self.metrics = metrics
        self.metrics_interval = metrics_interval
        self.publisher = publisher
        self.events = events
        self._next_log = 0.0
        self._next_metrics = 0.0

    def end_step(self, manager: Any) -> float | None:
        """Report what is due at the end of a step; return the seconds until
        anything is due again (None: at the next step)."""
        publisher = self.publisher
        if publisher is not None:
            batch = manager.take_event_batch()
            if batch is not None:
                publisher.publish(batch)
        if self.log is None and self.metrics is None:
            return None
        now = time.monotonic()
        if self.metrics is not None and now >= self._next_metrics:
            self._next_metrics = now + self.metrics_interval
            self.update_metrics(manager)
        if self.log is not None and now >= self._next_log:
            if self._next_log:
                self.log(manager.stats())
            self._next_log = now + self.log_interval
        if publisher is not None:
            return None
        due = min(
            self._next_metrics if self.metrics is not None else math.inf,
            self._next_log if self.log is not None else math.inf,
        )
        return max(0.0, due - time.monotonic())

    def update_metrics(self, manager: Any) -> None:
        """Copy the manager's ``stats()`` into the metrics now."""
        self.metrics.update(manager.stats(), manager.cache_size)

    @property
    def per_step(self) -> bool:
        """Whether anything runs at each step's end (else the manager needs no hook)."""
        return self.log is not None or self.metrics is not None or self.publisher is not None

    def close(self) -> None:
        for publisher in (self.publisher, self.events):
            if publisher is not None:
                publisher.close()


class _Observed:
    _observers: StepObservers

    @property
    def observers(self) -> StepObservers:
        """What the manager reports to; assigning observers with a publisher turns its events on."""
        return self._observers

    @observers.setter
    def observers(self, observers: StepObservers) -> None:
        if observers.publisher is not None:
            self.enable_events()  # type: ignore[attr-defined]
        self._observers = observers
        self.set_step_hook(observers.end_step if observers.per_step else None)  # type: ignore[attr-defined]

    def reset_stats(self) -> None:
        metrics = self._observers.metrics
        if metrics is not None:
            self._observers.update_metrics(self)  # what was counted so far stays counted
        super().reset_stats()  # type: ignore[misc]
        if metrics is not None:
            metrics.stats_reset()


_CLASSES: dict[type, type] = {}


def observed_class(base: type) -> type:
    """``base`` reporting to its ``observers`` once per step."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"Observed{base.__name__}", (_Observed, base), {"__module__": base.__module__})
    return cls


#: The ``manager_config`` keys that configure metrics and events (see ``ObserveOptions``).
OBSERVE_KEYS = (
    "metrics_port",
    "metrics_host",
    "events_endpoint",
    "events_replay_endpoint",
    "events_topic",
    "events_buffer_steps",
    "events_interval_ms",
)

#: What the startup line says when no metrics are exported.
METRICS_OFF_LINE = (
    "encoder cache: Prometheus metrics off; to add them to vLLM's /metrics, export "
    "PROMETHEUS_MULTIPROC_DIR=<an empty directory> before starting vLLM, or set manager_config "
    "metrics_port for an exporter of their own"
)


@dataclass(frozen=True)
class ObserveOptions:
    """The metrics and events keys of ``manager_config``.

    - ``metrics_port``: without ``PROMETHEUS_MULTIPROC_DIR``, serve the
      ``encoder_cache:`` metrics on this port (``metrics_host``, default
      0.0.0.0); engine N of several uses ``metrics_port + N``. With the
      directory set, the metrics go to vLLM's ``/metrics`` and this is unused.
    - ``events_endpoint``: publish cache events on this ZMQ endpoint (e.g.
      ``tcp://*:5570``; a wildcard host or port, ``ipc://`` and ``inproc://``
      are bound, others connected to); off without it.
    - ``events_replay_endpoint``: bind a replay socket here (e.g. ``tcp://*:5571``).
    - ``events_topic``: the topic frame (default ``encoder-cache``).
    - ``events_buffer_steps``: batches (messages) kept for replay (default 10,000).
    - ``events_interval_ms``: how often the publisher's thread drains the
      manager's events and sends them, as one message (default 50; from 1
      to 1,000).

    With several engines, the endpoints' ports move up by the engine index, as
    vLLM's KV-event endpoints do.
    """

    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    events_endpoint: str | None = None
    events_replay_endpoint: str | None = None
    events_topic: str = wire.DEFAULT_TOPIC
    events_buffer_steps: int = 10_000
    events_interval_ms: float = 50.0

    @classmethod
    def parse(cls, options: dict[str, Any]) -> ObserveOptions:
        """The observability keys of ``options`` (others are ignored); ValueError naming a bad one."""
        port = options.get("metrics_port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"manager_config metrics_port must be a port number (1-65535), got {port!r}")
        strings = {}
        for key in ("metrics_host", "events_endpoint", "events_replay_endpoint", "events_topic"):
            value = options.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"manager_config {key} must be a string, got {value!r}")
            strings[key] = value
        for key in ("events_endpoint", "events_replay_endpoint"):
            value = strings[key]
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"manager_config {key} must be a tcp://, ipc:// or inproc:// endpoint, got {value!r}")
        if strings["events_endpoint"] is None:
            for key in ("events_replay_endpoint", "events_topic", "events_buffer_steps", "events_interval_ms"):
                if key in options:
                    raise ValueError(f"manager_config {key} needs events_endpoint")
        steps = options.get("events_buffer_steps", 10_000)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"manager_config events_buffer_steps must be a positive int, got {steps!r}")
        interval = options.get("events_interval_ms", 50.0)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 1 <= interval <= 1000:
            raise ValueError(f"manager_config events_interval_ms must be a number from 1 to 1000, got {interval!r}")
        return cls(
            port,
            strings["metrics_host"] or "0.0.0.0",
            strings["events_endpoint"],
            strings["events_replay_endpoint"],
            wire.DEFAULT_TOPIC if strings["events_topic"] is None else strings["events_topic"],
            steps,
            float(interval),
        )

    def observers(
        self,
        *,
        engine: int = 0,
        model_name: str = "",
        log: Callable[[dict[str, Any]], None] | None = None,
        log_interval: float = 0.0,
        announce: Callable[[str], None] | None = None,
    ) -> StepObservers:
        """The observers these options ask for, for engine ``engine``: starts the
        metrics exporter and the event publisher (as ``events``, for the caller
        to ``watch`` the manager with). ``announce`` gets the startup line when
        no metrics are exported."""
        from encoder_cache import metrics as prom

        cache_metrics = None
        if prom.multiprocess_dir() is not None:
            cache_metrics = prom.CacheMetrics(model_name=model_name, engine=engine)
        elif self.metrics_port is not None:
            registry = prom.start_exporter(self.metrics_port + engine, self.metrics_host)
            cache_metrics = prom.CacheMetrics(model_name=model_name, engine=engine, registry=registry)
        elif announce is not None:
            announce(METRICS_OFF_LINE)
        events = None
        if self.events_endpoint is not None:
            from encoder_cache.events.publisher import EventPublisher, engine_endpoint

            replay = self.events_replay_endpoint
            events = EventPublisher(
                engine_endpoint(self.events_endpoint, engine),
                replay_endpoint=None if replay is None else engine_endpoint(replay, engine),
                topic=self.events_topic,
                buffer_steps=self.events_buffer_steps,
                engine=engine,
                interval=self.events_interval_ms / 1e3,
            )
        return StepObservers(log=log, log_interval=log_interval, metrics=cache_metrics, events=events)
