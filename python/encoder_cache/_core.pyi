"""Type stubs for the compiled module ``encoder_cache._core``.

The docstrings here are the runtime ones (``tests/test_stubs.py`` checks that
they match). Readable state (``cached``, ``freeable``, ...) is a fresh
snapshot on every access: changing it does not change the manager.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol, final

from typing_extensions import Self, disjoint_base

class _Placeholder(Protocol):
    offset: int
    length: int
    # None, a sequence of bools, an array, or anything with .tolist() (vLLM: a torch bool tensor).
    is_embed: Any
    def get_num_embeds(self) -> int: ...

class _Feature(Protocol):
    identifier: str
    mm_position: _Placeholder

class _Request(Protocol):
    request_id: str
    @property
    def mm_features(self) -> Sequence[_Feature]: ...
    def get_num_encoder_embeds(self, input_id: int) -> int: ...

# (to_encode, num_new_tokens, encoder_compute_budget, load_from_remote, repeated_in_step)
_StepResult = tuple[list[int], int, int, list[int], list[int]]
# (request, input_id, identifier, cached_num_embeds, requested_num_embeds)
_OnMismatch = Callable[[Any, int, str, int, int], object]

#: The eviction policies' names, the default first.
POLICIES: tuple[str, ...]

__all__ = [
    "HOST_POLICIES",
    "POLICIES",
    "EncoderCacheManager",
    "EncoderDecoderCacheManager",
    "EventBatch",
    "HostBlockCache",
    "HostCacheEntry",
    "_CallFloor",
    "_panic_for_test",
]

@disjoint_base
class EncoderCacheManager:
    """The encoder cache of a multimodal model, with vLLM 0.33's API: which items
    (by content hash) are cached, which requests reference them, which
    unreferenced entries may be evicted, and which evictions the workers must
    hear about. `cache_size` is counted in encoder embeddings; `policy` (one of
    `encoder_cache.POLICIES`) chooses which unreferenced entry goes first, and
    the default, "vllm", makes exactly vLLM 0.33's choices.
    """

    def __new__(cls, cache_size: int, *, policy: str = "vllm") -> Self: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool:
        """Return True if the item at `input_id` is cached, and record that the
        request uses it there (taking the entry off the eviction list if it was
        unreferenced); False if it is not cached.

        Raises IndexError for an input the request does not have, and
        ValueError if the request already holds this input as another item.
        """
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> int | None:
        """Return the embedding count cached for the item at `input_id`, or None if it is not cached."""
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool:
        """Return whether the item at `input_id` fits this step: within
        `encoder_compute_budget`, and in the cache beside the
        `num_embeds_to_schedule` embeddings the step already promised.

        Evicts unreferenced entries in the policy's order when that makes
        room; evicts nothing when even that would not. As in vLLM, the budget
        and count are compared as given: a negative budget fits nothing, a
        negative count adds room.
        """
    def allocate(self, request: _Request, input_id: int) -> None:
        """Reserve cache space for the item at `input_id`, about to be encoded,
        referenced by the request.

        Raises ValueError, changing nothing, if the item is already cached, if
        there is no room (call `can_allocate` first), or if the request holds
        this input as another item.
        """
    def get_cached_input_ids(self, request: _Request) -> set[int]:
        """Return the input ids the request holds in the cache.

        As with vLLM's live set, the set is the manager's: copy it before
        changing it. Unlike vLLM's, it never changes after it is handed out:
        while the request holds the same inputs every call returns the same
        set, and a change to the holdings makes a new one.
        """
    def free_encoder_input(self, request: _Request, input_id: int) -> None:
        """Drop the request's hold on one input. The request's reference to the
        item goes with its last held occurrence; an entry left unreferenced
        becomes evictable but stays cached until room is needed.

        Freeing an input the request does not hold (freed already, or never
        cached) changes nothing, as in vLLM; an input id the request does not
        have raises IndexError.
        """
    def free(self, request: _Request) -> None:
        """Drop every hold the request has (it finished, was aborted or was
        preempted), and forget what was read of it. Freeing a request the
        manager does not know, or one freed already, changes nothing.
        """
    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> EncoderCacheManager:
        """Build a manager of this class holding `cache_size` embeddings.

        vLLM's factory hook (`EncoderCacheManagerConfig.encoder_cache_manager_cls`);
        `vllm_config` is accepted and unused. Subclasses construct themselves.
        """
    def reset(self) -> None:
        """Forget every entry, request and pending report, keeping the capacity
        (vLLM calls this when the model's weights change).
        """
    def get_freed_mm_hashes(self) -> list[str]:
        """Return the identifiers whose cached outputs the workers must now drop,
        and clear the report.
        """
    def set_step_hook(self, hook: Callable[[Self], float | None] | None) -> None:
        """Run `hook(manager)` at the end of `get_freed_mm_hashes()`, which the
        scheduler calls once per step. The hook returns how many seconds it
        can wait before it runs again (None: it runs at the next step), and
        steps until then do not call it. `None` removes the hook. An
        exception the hook raises is reported through `sys.unraisablehook`,
        the step's identifiers are returned all the same, and the hook runs
        again at the next step.
        """
    def get_manager_metadata(self) -> None:
        """Return None: no metadata travels to the workers."""
    @property
    def cache_size(self) -> int:
        """The capacity, in encoder embeddings. Assigning resizes the cache:
        growing adds free slots; shrinking evicts unreferenced entries and
        raises ValueError, changing nothing, when the entries in use would not fit.
        """
    @cache_size.setter
    def cache_size(self, value: int) -> None: ...
    @property
    def num_free_slots(self) -> int:
        """Slots not taken by any entry."""
    def try_schedule_encoder_inputs(
        self,
        request: _Request,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
        *,
        disable_chunked_mm_input: bool = False,
        has_remote_item: Callable[[str], bool] | None = None,
        on_mismatch: _OnMismatch | None = None,
    ) -> _StepResult:
        """Schedule a request's encoder inputs for one step, as vLLM's scheduler loop does.

        Walks the items whose placeholders overlap the tokens
        `[num_computed_tokens, num_computed_tokens + num_new_tokens)`, taking
        cache hits, making room and budgeting the rest.
        Returns `(to_encode, num_new_tokens, encoder_compute_budget,
        from_remote, repeated)`: the input ids to encode, the possibly reduced
        token count and budget, the ids `has_remote_item(identifier)` says a
        remote encoder cache holds, and the ids repeated within the step.
        An item whose size disagrees with the cache is reported to
        `on_mismatch(request, input_id, identifier, cached, requested)` and
        nothing is scheduled. Raises IndexError or ValueError on bad input,
        changing nothing.
        """
    def allocate_encoder_inputs(
        self, request: _Request, input_ids: Sequence[int], duplicate_input_ids: Sequence[int]
    ) -> None:
        """Allocate the inputs `try_schedule_encoder_inputs` returned to encode,
        then take the hit for each of `duplicate_input_ids`.
        """
    def free_encoder_inputs_before(self, request: _Request, position: int) -> list[int]:
        """Free the held inputs whose placeholders end at or before `position`
        and return their ids, ascending (vLLM's `_free_encoder_inputs`).
        """
    def check_invariants(self) -> None:
        """Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule."""
    def snapshot(self) -> dict[str, Any]:
        """Return the whole state as plain, JSON-serialisable data; `restore` takes it back."""
    @classmethod
    def restore(cls, state: dict[str, Any]) -> EncoderCacheManager:
        """Build a manager in the state `snapshot()` returned.

        Raises TypeError or ValueError for a malformed dump, and ValueError
        for one that breaks a bookkeeping rule.
        """
    @property
    def policy(self) -> str:
        """The eviction policy's name, one of `encoder_cache.POLICIES`."""
    def mark_waiting(self, request: _Request, num_computed_tokens: int = 0) -> None:
        """Record that `request`, waiting to be scheduled, will need its items:
        until `unmark_waiting(request)`, an unreferenced entry it needs is
        evicted only after every unreferenced entry no waiting request needs.

        `num_computed_tokens` is where the request will start: the tokens its
        cached KV prefix covers. An item whose placeholder ends there or
        before is never looked up, so it is not marked.

        Marks apply to items not cached yet too. Raises ValueError, changing
        nothing, if the request is marked already or `num_computed_tokens` is
        negative.
        """
    def unmark_waiting(self, request: _Request) -> None:
        """Drop `request`'s waiting mark (it was scheduled, aborted or finished).
        Raises ValueError, changing nothing, if it has none.
        """
    def stats(self) -> dict[str, Any]:
        """Return the counters since construction or `reset_stats()`, and the cache's fill.

        Keys: `hits`, `misses`, `hit_embeds`, `miss_embeds` (one hit or miss
        per item a request acquires: a hit takes a cached entry, a miss
        allocates one to encode), `evictions`, `evicted_embeds`, `reencodes`
        and `reencode_embeds` (misses on items this manager evicted earlier),
        `entries`, `used_embeds`, `freeable_embeds`, and `by_modality`: the
        counters per `mm_features[i].modality` ("unknown" without one).
        """
    def reset_stats(self) -> None:
        """Zero the counters `stats()` reports; the cache's contents stay."""
    @property
    def num_freeable_slots(self) -> int:
        """Slots that are free or held by unreferenced (evictable) entries."""
    @property
    def cached(self) -> dict[str, set[str]]:
        """A snapshot: identifier -> set of the request ids referencing it."""
    @property
    def num_embeds_by_hash(self) -> dict[str, int]:
        """A snapshot: identifier -> embeddings cached."""
    @property
    def freeable(self) -> dict[str, int]:
        """A snapshot: unreferenced identifier -> embeddings, next eviction first."""
    @property
    def request_cached_ids(self) -> dict[str, set[int]]:
        """A snapshot: request id -> set of the input ids it holds."""
    @property
    def request_hash_refs(self) -> dict[str, dict[str, int]]:
        """A snapshot: request id -> identifier -> how many of the request's held inputs hold it."""
    @property
    def freed(self) -> list[str]:
        """A snapshot: identifiers evicted since the last `get_freed_mm_hashes()`, in eviction order."""
    def enable_events(self, max_pending: int | None = None) -> None:
        """Start recording cache events for `take_step_events()`: each
        allocation, each `get_freed_mm_hashes()` report, each `reset()`.

        Recording costs nothing while off (the default). At most
        `max_pending` identifiers (default 65,536) wait for a drain; past that the pending
        events are dropped and the next drain reports a clear and every
        cached item instead. Enabling again changes only the bound. Not part
        of `snapshot()`: a restored manager records nothing until enabled.
        """
    def take_step_events(self) -> tuple[bool, list[str], list[tuple[str, int, str]]]:
        """Return the cache events since the last call as `(cleared, removed,
        stored)`, and empty the log.

        Applied in order to the items known after the previous call, they
        give the cached items now: `cleared`, forget them all (the cache was
        reset, or the log overflowed); `removed`, the identifiers
        `get_freed_mm_hashes()` reported, in order; `stored`, the items
        allocated since and still cached, as `(identifier, embeds, modality)`
        in the order of their first allocation. Call it right after
        `get_freed_mm_hashes()`. Raises ValueError if events are off.
        """
    def take_event_batch(self) -> EventBatch | None:
        """Drain the cache events as `take_step_events()` does, as one
        `EventBatch`, or None if nothing was stored, removed or cleared.

        The batch keeps the events in Rust: `EventBatch.encode()` writes the
        message payload without a Python object per event. Raises ValueError
        if events are off.
        """
    def cached_items(self) -> list[tuple[str, int, str]]:
        """Return every cached item as `(identifier, embeds, modality)`, sorted by identifier."""

@disjoint_base
class EncoderDecoderCacheManager:
    """The encoder-output budget of an encoder-decoder model (Whisper-style),
    with vLLM 0.33's API: nothing is shared between requests, an input's slots
    are held until the decoder has consumed it, and each allocation is
    reported to the workers one `get_freed_mm_hashes()` late. Each held input
    is freed once, however often it is freed.
    """

    def __new__(cls, cache_size: int) -> Self: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool:
        """Return False: nothing is shared between requests, so there is never a hit."""
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> None:
        """Return None: nothing is shared between requests, so nothing is ever cached."""
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool:
        """Return whether the item at `input_id` fits this step: within
        `encoder_compute_budget`, and in the free slots beside the
        `num_embeds_to_schedule` embeddings the step already promised.
        """
    def allocate(self, request: _Request, input_id: int) -> None:
        """Reserve the slots of the item at `input_id` for the request.

        Raises ValueError, changing nothing, without room or for an input the
        request holds already.
        """
    def get_cached_input_ids(self, request: _Request) -> set[int]:
        """Return the input ids the request holds (allocated and not freed yet), as a new set."""
    def free_encoder_input(self, request: _Request, input_id: int) -> None:
        """Give back the slots of one held input. Freeing an input the request
        does not hold (freed already, or never allocated) changes nothing;
        vLLM 0.33 adds its size back on every call.
        """
    def free(self, request: _Request) -> None:
        """Give back the slots of every input the request holds, and forget what
        was read of it. Changes nothing for a request that holds none.
        """
    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> EncoderDecoderCacheManager:
        """Build a manager of this class holding `cache_size` embeddings.

        vLLM's factory hook (`EncoderCacheManagerConfig.encoder_cache_manager_cls`);
        `vllm_config` is accepted and unused. Subclasses construct themselves.
        """
    def reset(self) -> None:
        """Forget every entry, request and pending report, keeping the capacity
        (vLLM calls this when the model's weights change).
        """
    def get_freed_mm_hashes(self) -> list[str]:
        """Return the identifiers whose cached outputs the workers must now drop,
        and clear the report.
        """
    def set_step_hook(self, hook: Callable[[Self], float | None] | None) -> None:
        """Run `hook(manager)` at the end of `get_freed_mm_hashes()`, which the
        scheduler calls once per step. The hook returns how many seconds it
        can wait before it runs again (None: it runs at the next step), and
        steps until then do not call it. `None` removes the hook. An
        exception the hook raises is reported through `sys.unraisablehook`,
        the step's identifiers are returned all the same, and the hook runs
        again at the next step.
        """
    def get_manager_metadata(self) -> None:
        """Return None: no metadata travels to the workers."""
    @property
    def cache_size(self) -> int:
        """The capacity, in encoder embeddings. Assigning resizes the cache:
        growing adds free slots; shrinking evicts unreferenced entries and
        raises ValueError, changing nothing, when the entries in use would not fit.
        """
    @cache_size.setter
    def cache_size(self, value: int) -> None: ...
    @property
    def num_free_slots(self) -> int:
        """Slots not taken by any entry."""
    def try_schedule_encoder_inputs(
        self,
        request: _Request,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
        *,
        disable_chunked_mm_input: bool = False,
        has_remote_item: Callable[[str], bool] | None = None,
        on_mismatch: _OnMismatch | None = None,
    ) -> _StepResult:
        """Schedule a request's encoder inputs for one step, as vLLM's scheduler loop does.

        Walks the items whose placeholders overlap the tokens
        `[num_computed_tokens, num_computed_tokens + num_new_tokens)`, taking
        cache hits, making room and budgeting the rest.
        Returns `(to_encode, num_new_tokens, encoder_compute_budget,
        from_remote, repeated)`: the input ids to encode, the possibly reduced
        token count and budget, the ids `has_remote_item(identifier)` says a
        remote encoder cache holds, and the ids repeated within the step.
        An item whose size disagrees with the cache is reported to
        `on_mismatch(request, input_id, identifier, cached, requested)` and
        nothing is scheduled. Raises IndexError or ValueError on bad input,
        changing nothing.
        """
    def allocate_encoder_inputs(
        self, request: _Request, input_ids: Sequence[int], duplicate_input_ids: Sequence[int]
    ) -> None:
        """Allocate the inputs `try_schedule_encoder_inputs` returned to encode,
        then take the hit for each of `duplicate_input_ids`.
        """
    def free_encoder_inputs_before(self, request: _Request, position: int) -> list[int]:
        """Free the held inputs whose placeholders end at or before `position`
        and return their ids, ascending (vLLM's `_free_encoder_inputs`).
        """
    def check_invariants(self) -> None:
        """Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule."""
    def snapshot(self) -> dict[str, Any]:
        """Return the whole state as plain, JSON-serialisable data; `restore` takes it back."""
    @classmethod
    def restore(cls, state: dict[str, Any]) -> EncoderDecoderCacheManager:
        """Build a manager in the state `snapshot()` returned.

        Raises TypeError or ValueError for a malformed dump, and ValueError
        for one that breaks a bookkeeping rule.
        """
    @property
    def allocated(self) -> list[str]:
        """A snapshot: identifiers allocated since the last `get_freed_mm_hashes()`."""
    @property
    def to_free(self) -> list[str]:
        """A snapshot: identifiers the next `get_freed_mm_hashes()` returns."""

# The test hooks below exist only in builds with the cargo feature `test-hooks`
# (`make build`); the release wheel has neither.

def _panic_for_test() -> None:
    """Private test hook: panics in Rust, surfacing as pyo3's PanicException."""

@final
class _CallFloor:
    """Private benchmark aid: the manager's per-call methods, changing nothing.
    With ``reads=True`` each reads from the request what vLLM's manager reads
    on every call."""

    def __new__(cls, *, reads: bool = False) -> Self: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool: ...
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool: ...
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> None: ...
    def get_cached_input_ids(self, request: _Request) -> None: ...
    def allocate(self, request: _Request, input_id: int) -> None: ...
    def free_encoder_input(self, request: _Request, input_id: int) -> None: ...
    def free(self, request: _Request) -> None: ...

@final
class EventBatch:
    """The cache events of one step (`EncoderCacheManager.take_event_batch()`),
    held as Rust data: `encode` writes the message payload without making a
    Python object per event, so a publisher's thread can do it while the
    scheduler's thread only hands the batch over.
    """

    @property
    def cleared(self) -> bool:
        """Whether the cache was cleared (reset, or its log overflowed) first."""
    @property
    def removed(self) -> list[str]:
        """The identifiers `get_freed_mm_hashes()` reported, in order."""
    @property
    def stored(self) -> list[tuple[str, int, str]]:
        """The items stored and still cached, as `(identifier, embeds, modality)`."""
    def events(self, medium: str = "GPU") -> list[dict[str, Any]]:
        """The event maps, in order: `EncoderCacheCleared` if cleared, one
        `EncoderCacheRemoved` with the removed identifiers, one
        `EncoderCacheStored` per stored item (see `encoder_cache.events.wire`).
        """
    def encode(self, timestamp: float, engine: int, medium: str = "GPU") -> bytes:
        """The message payload: msgpack of `[timestamp, self.events(medium), engine]`,
        the same bytes `msgpack.packb(..., use_bin_type=True)` makes of it.
        """
    def __len__(self) -> int:
        """The number of event maps."""

#: The host tier's eviction policies' names, the default first.
HOST_POLICIES: tuple[str, ...]

@final
class HostCacheEntry:
    """One entry of a `HostBlockCache`: the blocks holding an item's encoder
    output in the host region. `block_ids` (ascending) and `shape` are fixed;
    `ready` and `evictable` follow the entry's state.
    """

    @property
    def block_ids(self) -> tuple[int, ...]:
        """The entry's blocks in the host region, ascending."""
    @property
    def shape(self) -> tuple[int, int] | None:
        """The encoder output's (rows, width), as given to `alloc`, or None."""
    @property
    def ready(self) -> bool:
        """Whether the entry's bytes are written (`mark_ready` was called)."""
    @property
    def evictable(self) -> bool:
        """Whether the entry is ready and unpinned, so an allocation may evict it."""

@final
class HostBlockCache:
    """A fixed pool of host-memory blocks holding encoder outputs by content hash,
    with vLLM 0.33's `EmbeddingCache` API. An entry is allocated not ready,
    becomes ready (and evictable) with `mark_ready`, and is pinned while loads
    read it; an allocation that lacks free blocks evicts ready, unpinned entries
    in the `policy`'s order ("fifo", the default, is vLLM's), and fails,
    evicting nothing, when even all of those would not make room.
    """

    def __new__(cls, num_blocks: int, *, policy: str = "fifo") -> Self: ...
    def get(self, key: str) -> HostCacheEntry | None:
        """Return the entry for `key` (in any state), or None if there is none."""
    def has_held_entries(self) -> bool:
        """Return True if any entry is not ready or pinned (a save or a load in flight)."""
    def alloc(self, key: str, n_blocks: int, shape: tuple[int, int] | None = None) -> HostCacheEntry | None:
        """Allocate `n_blocks` blocks for `key`, evicting as needed, and return its
        new entry, not ready; `shape` is the encoder output (rows, width) the
        blocks will hold. Return None, evicting nothing, if the free and
        evictable blocks together are too few.

        Raises ValueError, changing nothing, if `key` has an entry already or
        `n_blocks` exceeds the pool, and TypeError or ValueError for an
        `n_blocks` that is not a non-negative int or a `shape` that is not None
        or a tuple of two non-negative ints.
        """
    def mark_ready(self, key: str) -> None:
        """Mark `key`'s entry ready: its bytes are written, and it becomes evictable.

        Raises KeyError if `key` has no entry, ValueError if it is ready already.
        """
    def pin(self, key: str) -> None:
        """Pin `key`'s ready entry: a load reads it, so it cannot be evicted until
        the matching `unpin`.

        Raises KeyError if `key` has no entry, ValueError if it is not ready.
        """
    def pin_if_ready(self, key: str) -> HostCacheEntry | None:
        """Pin `key` if its entry is ready, and return the entry; return a
        not-ready entry without pinning it, and None if `key` has no entry.
        """
    def unpin(self, key: str) -> None:
        """Release one pin of `key`'s entry; with none left it becomes evictable.

        Raises KeyError if `key` has no entry, ValueError if it is not pinned.
        """
    def discard(self, key: str) -> None:
        """Drop `key`'s not-ready entry (its write failed); its blocks go back to
        the pool.

        Raises KeyError if `key` has no entry, ValueError if it is ready or
        pinned (those leave by eviction).
        """
    def eviction_order(self) -> list[str]:
        """Return the keys of the evictable entries in the order the policy looks
        at them: for "fifo" the eviction order; for "s3fifo" the never-loaded
        lane, then the loaded one (whose entries may go round before leaving);
        for "gdsf" by priority.
        """
    def keys(self) -> list[str]:
        """Return the keys of every entry, in no particular order."""
    def stats(self) -> dict[str, int]:
        """Return the counters since construction: `allocs`, `alloc_failures`
        (allocations refused for want of space), `pins`, `evictions`,
        `evicted_blocks`, `discards`; and the fill: `entries`, `free_blocks`,
        `evictable_blocks`.
        """
    def check_invariants(self) -> None:
        """Check the bookkeeping's rules (every block free or held by exactly one
        entry, the evictable counts, the eviction order); raise
        `encoder_cache.InvariantError` naming the first one broken.
        """
    @property
    def evictable_blocks(self) -> int:
        """The blocks that evictions could free now (those of ready, unpinned entries)."""
    @property
    def policy(self) -> str:
        """The eviction policy's name, one of `encoder_cache.HOST_POLICIES`."""
    @property
    def num_blocks(self) -> int:
        """The number of blocks in the pool."""
    @property
    def free_blocks(self) -> list[int]:
        """The free blocks, in the order they are pushed back (the last is handed
        out first). A fresh list.
        """
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
