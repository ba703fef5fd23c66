"""vLLM's KV-cache events as a router consumes them: each replica's block pool
publishes them, and one index per replica rebuilds its cached block hashes.

vLLM's ``BlockPool`` with KV events on queues a ``BlockStored`` when it keys a
full block with its hash and a ``BlockRemoved`` when it hands a keyed block
out again (the block forgets its hash); ``AllBlocksCleared`` when the prefix
cache is reset. A router subscribed to them (llm-d's precise prefix-cache
scorer) knows every replica's cached blocks without asking the replica.
Here ``EventedPool`` queues the same events (one hash each) and
``KvBlockIndex`` applies them; the cluster moves each replica's queue to the
index after every window it runs, so at a routing decision the index holds
what every step before it published.

Two blocks may carry the same hash (vLLM does not deduplicate), so the index
counts the blocks per hash: a hash is cached while one of its blocks is.

``PromptHashes`` gives a request's block hashes as a replica computes them
(``prompts.Prompts`` and ``prefix_cache.BlockHasher``, in the same process):
the full blocks admission looks up, every one but the block of the last
prompt token. With the positional trace format a session turn's tokens
depend on its previous turn; ``PromptHashes`` sees every turn, a replica only
those placed on it, so without sticky sessions the two may differ there.
"""

from __future__ import annotations

from collections.abc import Iterable

from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher, BlockPool
from encoder_cache.simulator.prompts import Prompts
from encoder_cache.simulator.spec import RequestSpec

__all__ = [
    "ALL_BLOCKS_CLEARED",
    "BLOCK_REMOVED",
    "BLOCK_STORED",
    "EventedPool",
    "KvBlockIndex",
    "KvEvent",
    "PromptHashes",
]

BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"

#: ``(type, block hash)``; the hash is None for ``AllBlocksCleared``.
KvEvent = tuple[str, int | None]


class EventedPool(BlockPool):
    """A ``BlockPool`` that queues vLLM's KV-cache events; ``take_events()`` drains them."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        super().__init__(num_blocks, caching)
        self.events: list[KvEvent] = []

    @classmethod
    def like(cls, pool: BlockPool) -> EventedPool:
        """A fresh pool of ``pool``'s size and caching (for a pool nothing has used yet)."""
        return cls(pool.num_blocks, pool.caching)

    def cache(self, block: int, h: int) -> None:
        if self.caching and self.key[block] is None:
            self.events.append((BLOCK_STORED, h))
        super().cache(block, h)

    def _unmap(self, h: int, block: int) -> None:
        entry = self.by_hash.get(h)
        if entry == block or (isinstance(entry, dict) and block in entry):
            self.events.append((BLOCK_REMOVED, h))
        super()._unmap(h, block)

    def cached_hashes(self) -> dict[int, int]:
        """The pool's own view (for checks): hash -> blocks keyed with it."""
        return {h: 1 if isinstance(e, int) else len(e) for h, e in self.by_hash.items()}

    def take_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events


class KvBlockIndex:
    """Every replica's cached block hashes, rebuilt from its KV-cache events."""

    def __init__(self, replicas: int) -> None:
        #: Per replica: block hash -> blocks holding it.
        self.blocks: list[dict[int, int]] = [{} for _ in range(replicas)]

    def apply(self, replica: int, events: Iterable[KvEvent]) -> None:
        held = self.blocks[replica]
        for kind, h in events:
            if kind == BLOCK_STORED:
                held[h] = held.get(h, 0) + 1  # type: ignore[index]
            elif kind == BLOCK_REMOVED:
                n = held.get(h, 0)  # type: ignore[arg-type]
                if n > 1:
                    held[h] = n - 1  # type: ignore[index]
                else:
                    held.pop(h, None)  # type: ignore[arg-type]
            elif kind == ALL_BLOCKS_CLEARED:
                held.clear()

    def prefix_blocks(self, replica: int, hashes: list[int]) -> int:
        """How many of ``hashes``, from the first, the replica holds: its cached prefix."""
        held = self.blocks[replica]
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def prefix_tokens(self, replica: int, hashes: list[int]) -> int:
        return self.prefix_blocks(replica, hashes) * BLOCK_SIZE


class PromptHashes:
    """The block hashes of each request's prompt, as a replica computes them.
    ``of`` must see the requests in arrival order (see the module doc); it
    remembers the last request's hashes, so asking twice costs nothing."""

    def __init__(self) -> None:
        self.prompts = Prompts()
        self._last: tuple[RequestSpec | None, list[int]] = (None, [])

    def of(self, spec: RequestSpec) -> list[int]:
        if self._last[0] is spec:
            return self._last[1]
        lookup = (spec.prompt_tokens - 1) // BLOCK_SIZE
        hashes = BlockHasher(self.prompts.runs(spec), spec.items, BLOCK_SIZE).upto(lookup)[:lookup]
        self._last = (spec, hashes)
        return hashes
