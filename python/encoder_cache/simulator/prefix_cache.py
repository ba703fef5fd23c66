"""The KV cache as vLLM V1 keeps it: a pool of fixed-size blocks, with
automatic prefix caching.

A request holds one block per ``block_size`` tokens it has computed or is
computing. A block becomes *cached* once the scheduler has scheduled it full
(vLLM keys blocks when it allocates their slots, not after the step): it is
keyed by a hash chained over the prefix (the parent block's hash and this
block's tokens; multimodal placeholder tokens contribute their item's
identifier, as vLLM's ``extra_keys`` do). A freed block keeps its key and
stays reusable until the pool hands it out again; the free queue's order is
vLLM's (``BlockPool`` below). On admission the scheduler looks the request's
full blocks up in order and skips the longest cached prefix (at most all but
the last token, which must be computed).

Token identity: a request's tokens are described by runs of content
(``prompts.py``); two blocks hash alike exactly when their prefixes have the
same runs and their items the same identifiers at the same places, as vLLM's
block hashes do on token ids (its extra keys name each item a block holds and
where it starts relative to the block).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from typing import Any

from encoder_cache.simulator.spec import Item

#: ``(start, end, key, first)``, as ``prompts.Run``.
Run = tuple[int, int, Any, int]

__all__ = ["BLOCK_SIZE", "BlockHasher", "BlockPool"]

#: vLLM's default KV block size, in tokens.
BLOCK_SIZE = 16


class BlockHasher:
    """The chained hashes of one request's full blocks, computed as needed."""

    __slots__ = ("block_size", "hashes", "item_ends", "item_ids", "item_starts", "run_starts", "runs")

    def __init__(self, runs: list[Run], items: tuple[Item, ...], block_size: int) -> None:
        self.block_size = block_size
        self.runs = runs  # sorted, contiguous from 0: (start, end, key, first)
        self.run_starts = [r[0] for r in runs]
        self.item_starts = [i.offset for i in items]
        self.item_ends = [i.offset + i.length for i in items]
        self.item_ids = [i.identifier for i in items]
        self.hashes: list[int] = []

    def upto(self, num_blocks: int) -> list[int]:
        """The hashes of the first ``num_blocks`` full blocks."""
        hashes, size = self.hashes, self.block_size
        if len(hashes) >= num_blocks:
            return hashes
        parent = hashes[-1] if hashes else 0
        runs, item_starts, item_ends, item_ids = self.runs, self.item_starts, self.item_ends, self.item_ids
        lo = len(hashes) * size
        k = bisect_right(self.run_starts, lo) - 1
        i = bisect_right(item_ends, lo)
        num_items, num_runs = len(item_starts), len(runs)
        append = hashes.append
        while len(hashes) < num_blocks:
            hi = lo + size
            while runs[k][1] <= lo:
                k += 1
            while i < num_items and item_ends[i] <= lo:
                i += 1
            start, end, key, first = runs[k]
            if end >= hi:
                # Fast paths: a stretch of blocks inside this run that hold no item, or
                # only the placeholders of item i, hash alike but for their offsets.
                if i >= num_items or item_starts[i] >= hi:
                    limit = end if i >= num_items else min(end, item_starts[i])
                    stop = min(lo + (num_blocks - len(hashes)) * size, limit - (limit - lo) % size)
                    if first >= 0:
                        base = first - start
                        for b in range(lo, stop, size):
                            parent = hash((parent, (key, base + b)))
                            append(parent)
                    else:
                        for _ in range(lo, stop, size):
                            parent = hash((parent, key))
                            append(parent)
                    lo = stop
                    continue
                if item_starts[i] <= lo and item_ends[i] >= hi:
                    limit = min(end, item_ends[i])
                    stop = min(lo + (num_blocks - len(hashes)) * size, limit - (limit - lo) % size)
                    identifier, offset = item_ids[i], item_starts[i]
                    if first >= 0:
                        base = first - start
                        for b in range(lo, stop, size):
                            parent = hash((parent, ((key, base + b), (identifier, offset - b))))
                            append(parent)
                    else:
                        for b in range(lo, stop, size):
                            parent = hash((parent, (key, (identifier, offset - b))))
                            append(parent)
                    lo = stop
                    continue
                content: object = (key, first + lo - start) if first >= 0 else key
            else:
                pieces: list[object] = [_piece(runs[k], lo, hi)]
                j = k + 1
                while j < num_runs and runs[j][0] < hi:
                    pieces.append(_piece(runs[j], lo, hi))
                    j += 1
                content = tuple(pieces)
            if i < num_items and item_starts[i] < hi:
                extra = []
                j = i
                while j < num_items and item_starts[j] < hi:
                    extra.append((item_ids[j], item_starts[j] - lo))
                    j += 1
                content = (content, *extra)
            parent = hash((parent, content))
            append(parent)
            lo = hi
        return hashes


def _piece(run: Run, lo: int, hi: int) -> tuple[object, int, int]:
    """The part of ``run`` inside ``[lo, hi)``: its key and which of its tokens."""
    start, end, key, first = run
    a, b = max(lo, start), min(hi, end)
    if first < 0:
        return (key, -1, b - a)
    return (key, first + a - start, first + b - start)


class BlockPool:
    """vLLM's ``BlockPool`` for one full-attention group: blocks with reference
    counts, a hash -> blocks map for full blocks, and the free queue in the
    order blocks are handed out.

    - Block 0 is vLLM's null block: it is never handed out, so the pool holds
      ``num_blocks - 1`` usable blocks.
    - A request frees its blocks tail first. Freed blocks without a hash (a
      partial last block, or every block with prefix caching off) go to the
      front of the queue, to be reused first; freed blocks with a hash go to
      its back, so cached blocks are evicted least recently freed first.
    - A block handed out forgets its hash. Two blocks may carry the same hash
      (vLLM does not deduplicate); a lookup finds the one keyed first.
    """

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self.refs = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int | dict[int, None]] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    def longest_prefix(self, hashes: list[int]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes``."""
        blocks: list[int] = []
        if self.caching:
            by_hash = self.by_hash
            for h in hashes:
                entry = by_hash.get(h)
                if entry is None:
                    break
                blocks.append(entry if isinstance(entry, int) else next(iter(entry)))
        return blocks

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of ``blocks`` (cached hits) sit in the free queue: taking them shrinks it."""
        refs = self.refs
        return sum(1 for b in blocks if not refs[b])

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if not self.refs[b]:
                del self.free[b]
            self.refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks from the free queue's front; their old hashes are forgotten."""
        blocks = []
        free, key, refs = self.free, self.key, self.refs
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = key[b]
            if h is not None:
                key[b] = None
                self._unmap(h, b)
            refs[b] = 1
            blocks.append(b)
        return blocks

    def _unmap(self, h: int, block: int) -> None:
        entry = self.by_hash.get(h)
        if entry is None:
            return
        if isinstance(entry, int):
            if entry == block:
                del self.by_hash[h]
        else:
            entry.pop(block, None)
            if not entry:
                del self.by_hash[h]

    def release(self, blocks: list[int]) -> None:
        """Drop a request's blocks, tail first: unhashed ones to the queue's
        front (reused first), hashed ones to its back (evicted last)."""
        first: list[int] = []
        refs, key, free = self.refs, self.key, self.free
        for b in reversed(blocks):
            refs[b] -= 1
            if not refs[b]:
                if key[b] is None or not self.caching:
                    first.append(b)
                else:
                    free[b] = None
        for b in reversed(first):
            free[b] = None
            free.move_to_end(b, last=False)

    def cache(self, block: int, h: int) -> None:
        """Key a full block (a block keeps the hash it was given until it is handed out again)."""
        if not self.caching or self.key[block] is not None:
            return
        self.key[block] = h
        entry = self.by_hash.get(h)
        if entry is None:
            self.by_hash[h] = block
        elif isinstance(entry, int):
            self.by_hash[h] = {entry: None, block: None}
        else:
            entry[block] = None
