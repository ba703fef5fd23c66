"""A pure-Python twin of ``encoder_cache.HostBlockCache``, and the random
operation sequences the differential tests drive through both.

The twin is written for clarity, not speed: every victim is found by a
scan. It keeps the Rust cache's rules (see src/host_tier/): a free-block
stack, ascending block ids per entry, entries not ready (pins -1), ready
(0) or pinned (> 0), and the three policies' victims with the same
tie-breaks and the same floating-point arithmetic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

GDSF_COST_SCALE = 8192.0
S3FIFO_MAX_CREDIT = 3
POLICIES = ("fifo", "gdsf", "s3fifo")


@dataclass
class TwinEntry:
    block_ids: tuple[int, ...]
    shape: tuple[int, int] | None
    rows: int
    pins: int = -1
    frequency: int = 1
    # While evictable: its lane, its place's sequence number, GDSF priority, S3-FIFO credit.
    lane: int = 0
    seq: int = 0
    priority: float = 0.0
    credit: int = 0

    @property
    def ready(self) -> bool:
        return self.pins >= 0

    @property
    def evictable(self) -> bool:
        return self.pins == 0


@dataclass
class TwinStats:
    allocs: int = 0
    alloc_failures: int = 0
    pins: int = 0
    evictions: int = 0
    evicted_blocks: int = 0
    discards: int = 0


def cost_per_block(rows: int, blocks: int) -> float:
    n = float(rows)
    return (n + n * n / GDSF_COST_SCALE) / float(max(blocks, 1))


@dataclass
class TwinBlockCache:
    num_blocks: int
    policy: str = "fifo"
    free_blocks: list[int] = field(default_factory=list)
    entries: dict[str, TwinEntry] = field(default_factory=dict)
    clock: float = 0.0
    counters: TwinStats = field(default_factory=TwinStats)
    _seq: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        self.free_blocks = list(range(self.num_blocks))

    # --- the EmbeddingCache API ---

    def get(self, key: str) -> TwinEntry | None:
        return self.entries.get(key)

    def has_held_entries(self) -> bool:
        return any(not e.evictable for e in self.entries.values())

    def alloc(self, key: str, n_blocks: int, shape: tuple[int, int] | None = None) -> TwinEntry | None:
        if key in self.entries:
            raise ValueError(f"duplicate alloc of {key!r}")
        if n_blocks > self.num_blocks:
            raise ValueError(f"{key!r} needs {n_blocks} blocks, the cache has {self.num_blocks}")
        if len(self.free_blocks) + self.evictable_blocks < n_blocks:
            self.counters.alloc_failures += 1
            return None
        while len(self.free_blocks) < n_blocks:
            self._evict_one()
        taken = [self.free_blocks.pop() for _ in range(n_blocks)]
        rows = shape[0] if shape is not None else n_blocks
        entry = TwinEntry(tuple(sorted(taken)), shape, rows)
        self.entries[key] = entry
        self.counters.allocs += 1
        return entry

    def mark_ready(self, key: str) -> None:
        entry = self.entries[key]
        if entry.pins != -1:
            raise ValueError(f"mark_ready of ready {key!r}")
        entry.pins = 0
        self._make_evictable(entry)

    def pin(self, key: str) -> None:
        entry = self.entries[key]
        if entry.pins == -1:
            raise ValueError(f"pin of not-ready {key!r}")
        self._pin(entry)

    def pin_if_ready(self, key: str) -> TwinEntry | None:
        entry = self.entries.get(key)
        if entry is not None and entry.ready:
            self._pin(entry)
        return entry

    def unpin(self, key: str) -> None:
        entry = self.entries[key]
        if entry.pins <= 0:
            raise ValueError(f"unpin of unpinned {key!r}")
        entry.pins -= 1
        if entry.pins == 0:
            self._make_evictable(entry)

    def discard(self, key: str) -> None:
        entry = self.entries[key]
        if entry.pins != -1:
            raise ValueError(f"discard of ready {key!r}")
        del self.entries[key]
        self.free_blocks.extend(entry.block_ids)
        self.counters.discards += 1

    # --- what the Rust cache reports ---

    @property
    def evictable_blocks(self) -> int:
        return sum(len(e.block_ids) for e in self.entries.values() if e.evictable)

    def eviction_order(self) -> list[str]:
        evictable = [(k, e) for k, e in self.entries.items() if e.evictable]
        if self.policy == "gdsf":
            evictable.sort(key=lambda ke: (ke[1].priority, ke[1].seq))
        else:
            evictable.sort(key=lambda ke: (ke[1].lane, ke[1].seq))
        return [k for k, _ in evictable]

    def stats(self) -> dict[str, int]:
        return {
            **vars(self.counters),
            "entries": len(self.entries),
            "free_blocks": len(self.free_blocks),
            "evictable_blocks": self.evictable_blocks,
        }

    # --- the policies ---

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _pin(self, entry: TwinEntry) -> None:
        entry.pins += 1
        entry.frequency += 1
        self.counters.pins += 1

    def _make_evictable(self, entry: TwinEntry) -> None:
        entry.seq = self._next_seq()
        entry.lane = int(self.policy == "s3fifo" and entry.frequency > 1)
        entry.credit = min(entry.frequency - 1, S3FIFO_MAX_CREDIT)
        entry.priority = (
            self.clock + entry.frequency * cost_per_block(entry.rows, len(entry.block_ids))
            if self.policy == "gdsf"
            else 0.0
        )

    def _evict_one(self) -> None:
        while True:
            key = self.eviction_order()[0]
            entry = self.entries[key]
            if self.policy == "s3fifo" and entry.lane == 1 and entry.credit > 0:
                entry.credit -= 1
                entry.seq = self._next_seq()
                continue
            if self.policy == "gdsf":
                self.clock = max(self.clock, entry.priority)
            del self.entries[key]
            self.free_blocks.extend(entry.block_ids)
            self.counters.evictions += 1
            self.counters.evicted_blocks += len(entry.block_ids)
            return


def random_operations(
    seed: int, num_ops: int, num_keys: int = 12, max_blocks: int = 10, with_shape: bool = True
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Valid-typed calls (method name, args) in random order, many of them
    refused by the cache's state: a duplicate alloc, an unpin of an
    unpinned entry, an unknown key. Unpins outnumber pins, so pins do not
    pile up and allocations keep evicting."""
    rng = random.Random(seed)
    weights = {"alloc": 5, "mark_ready": 3, "pin": 2, "pin_if_ready": 2, "unpin": 4, "discard": 1, "get": 2}
    methods, w = list(weights), list(weights.values())
    for _ in range(num_ops):
        method = rng.choices(methods, w)[0]
        key = f"mm-{rng.randrange(num_keys)}"
        if method == "alloc":
            n = rng.randrange(max_blocks + 1)
            shape = (n, 16) if with_shape and rng.random() < 0.8 else None
            yield method, (key, n, shape)
        else:
            yield method, (key,)
