"""What ``lfu-ghost`` and ``duel`` remember of the items they evicted: each
one's count of acquisitions, so an item allocated again resumes it. The twin
of the Rust core's ``src/cache/frequency_memory.rs``: the same bound, the same
items forgotten, by identifier where Rust keeps 64-bit hashes.
"""

from __future__ import annotations

__all__ = [
    "FREQUENCY_MEMORY",
    "FREQUENCY_MEMORY_EMBEDS",
    "FREQUENCY_MEMORY_MAX",
    "FrequencyMemory",
    "frequency_memory_bound",
]

#: The fewest evicted items a frequency memory remembers: its bound for caches
#: of up to ``FREQUENCY_MEMORY * FREQUENCY_MEMORY_EMBEDS`` embeddings.
FREQUENCY_MEMORY = 2048

#: Past the least bound, one more evicted item remembered per this many
#: embeddings the cache holds.
FREQUENCY_MEMORY_EMBEDS = 64

#: The most evicted items a frequency memory remembers, however large the cache.
FREQUENCY_MEMORY_MAX = 1 << 16


def frequency_memory_bound(cache_size: int) -> int:
    """How many evicted items a cache of ``cache_size`` embeddings remembers the counts of."""
    return min(max(cache_size // FREQUENCY_MEMORY_EMBEDS, FREQUENCY_MEMORY), FREQUENCY_MEMORY_MAX)


class FrequencyMemory:
    """Evicted items' counts, oldest eviction first, forgetting the oldest past
    the bound. The bound follows the cache size (:meth:`sized`) from the next
    eviction on."""

    def __init__(self) -> None:
        #: identifier -> count at eviction, oldest eviction first.
        self.counts: dict[str, int] = {}
        self.bound = FREQUENCY_MEMORY

    def sized(self, cache_size: int) -> None:
        self.bound = frequency_memory_bound(cache_size)

    def clear(self) -> None:
        self.counts.clear()

    def insert(self, identifier: str, count: int) -> None:
        """``identifier`` was evicted after ``count`` acquisitions."""
        self.counts.pop(identifier, None)
        self.counts[identifier] = count
        while len(self.counts) > self.bound:
            del self.counts[next(iter(self.counts))]

    def take(self, identifier: str) -> int:
        """The count remembered for ``identifier`` (0 if none), which is forgotten."""
        return self.counts.pop(identifier, 0)
