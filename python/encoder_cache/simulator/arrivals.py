"""When a workload's requests reach the scheduler's waiting queue.

Open-loop requests arrive at their ``arrival`` step. A session turn with a
think time is closed-loop: it arrives ``think`` steps after the step its
session's previous turn finished (plus one), and never before its own
``arrival``; while that previous turn is still running it waits for it. The
workload is read as a stream, one request ahead, so a trace of any length
replays in constant memory (plus the turns being delayed).

Any engine can drive this: each step it asks ``due(clock)`` for the requests
that arrive, tells ``finished(spec, clock)`` when one completes, and, when it
has nothing to run, jumps its clock to ``next_event()``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from encoder_cache.simulator.spec import RequestSpec

__all__ = ["Arrivals"]


class _Tail:
    """A session's last read request: the next turn waits for it to finish."""

    __slots__ = ("finished", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.finished: int | None = None  # the step it finished at


class Arrivals:
    """Releases ``specs`` (in arrival order) to an engine, step by step."""

    def __init__(self, specs: Iterator[RequestSpec]) -> None:
        self.specs = specs
        self.next_spec: RequestSpec | None = next(specs, None)
        self.delayed: list[tuple[int, int, RequestSpec]] = []  # (step, order pushed, spec)
        self.pushed = 0
        #: Requests read from the workload and not yet finished.
        self.in_flight = 0
        self.tails: dict[str, _Tail] = {}
        self.waiters: dict[str, RequestSpec] = {}  # request id -> the next turn waiting for it to finish

    def due(self, clock: int) -> list[RequestSpec]:
        """The requests that enter the waiting queue at step ``clock``, in order."""
        out: list[RequestSpec] = []
        while self.next_spec is not None and self.next_spec.arrival <= clock:
            spec = self.next_spec
            self.next_spec = next(self.specs, None)
            self.in_flight += 1
            if spec.session is None:
                out.append(spec)
                continue
            tail = self.tails.get(spec.session)
            self.tails[spec.session] = _Tail(spec.request_id)
            if spec.think is not None and tail is not None:
                if tail.finished is None:  # the previous turn has not finished: wait for it
                    self.waiters[tail.request_id] = spec
                    continue
                when = max(spec.arrival, tail.finished + 1 + spec.think)
                if when > clock:
                    self._delay(when, spec)
                    continue
            out.append(spec)
        while self.delayed and self.delayed[0][0] <= clock:
            out.append(heapq.heappop(self.delayed)[2])
        return out

    def finished(self, spec: RequestSpec, clock: int) -> None:
        """``spec`` finished at step ``clock``: a turn waiting for it is released after its think time."""
        self.in_flight -= 1
        if spec.session is None:
            return
        tail = self.tails[spec.session]
        if tail.request_id == spec.request_id:
            tail.finished = clock
        waiter = self.waiters.pop(spec.request_id, None)
        if waiter is not None:
            self._delay(max(waiter.arrival, clock + 1 + (waiter.think or 0)), waiter)

    def next_event(self) -> int | None:
        """The earliest step at which a request may arrive, or None when none will."""
        times = []
        if self.next_spec is not None:
            times.append(self.next_spec.arrival)
        if self.delayed:
            times.append(self.delayed[0][0])
        return min(times) if times else None

    def _delay(self, when: int, spec: RequestSpec) -> None:
        heapq.heappush(self.delayed, (when, self.pushed, spec))
        self.pushed += 1
