"""The scheduler model's state: a request in flight and one scheduled step."""

from __future__ import annotations

from typing import Any

from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher
from encoder_cache.simulator.prompts import Run
from encoder_cache.simulator.spec import RequestSpec

__all__ = ["PREEMPTED", "RUNNING", "WAITING", "Batch", "Live", "blocks_for"]


class Live:
    """A request in flight: the manager's ``Request`` plus the scheduler's state."""

    __slots__ = (
        "blocks",
        "drained",
        "ends",
        "finished",
        "hasher",
        "in_flight",
        "num_cached",
        "num_output",
        "num_tokens",
        "placeholders",
        "request",
        "served",
        "spec",
        "stale",
        "starts",
        "status",
    )

    def __init__(self, spec: RequestSpec, runs: list[Run]) -> None:
        self.spec = spec
        features = [
            MultiModalFeature(item.identifier, PlaceholderRange(item.offset, item.length), item.modality)
            for item in spec.items
        ]
        self.request = Request(spec.request_id, features)
        self.num_tokens = spec.prompt_tokens  # prompt plus the output decoded so far
        self.num_output = 0
        self.served = [False] * len(features)  # encoded, hit or in the cached prefix since the (re)start
        self.starts = [item.offset for item in spec.items]
        self.ends = [item.offset + item.length for item in spec.items]
        self.hasher = BlockHasher(runs, spec.items, BLOCK_SIZE)
        self.blocks: list[int] = []
        self.num_cached = 0  # leading blocks keyed in the prefix cache
        self.drained = False  # every encoder input it could hold is freed (until a restart)
        self.finished: int | None = None  # the step it finished at
        self.status = WAITING
        #: Async scheduling: tokens scheduled but not sampled yet (vLLM's
        #: output placeholders), tokens in steps not processed yet, and of
        #: those the ones scheduled before a preemption (their output is stale).
        self.placeholders = 0
        self.in_flight = 0
        self.stale = 0


WAITING, RUNNING, PREEMPTED = 0, 1, 2


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class Batch:
    """One scheduled step: ``(request, tokens, samples a token)`` per scheduled request."""

    __slots__ = ("entries", "host_work", "tokens")

    def __init__(self) -> None:
        self.entries: list[tuple[Live, int, bool]] = []
        self.tokens = 0
        self.host_work: Any = None  # the host tier's saves and loads of this step
