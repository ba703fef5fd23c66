"""Type stubs for the compiled module ``encoder_cache._core``.

Readable state (``cached``, ``freeable``, ...) is returned as a fresh snapshot
on every access: mutating it does not change the manager.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol

class _Placeholder(Protocol):
    offset: int
    length: int
    # None, a sequence of bools, or anything with .tolist() (vLLM: a torch bool tensor).
    is_embed: Any
    def get_num_embeds(self) -> int: ...
    def get_embeds_indices_in_range(self, start_idx: int, end_idx: int) -> tuple[int, int]: ...

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

class _StepMethods:
    """One call per request per scheduler step, in place of vLLM 0.33's per-item
    loops (Scheduler._try_schedule_encoder_inputs, _allocate_encoder_inputs,
    _free_encoder_inputs), with the same results and effects on the cache.

    What is read from a request is kept per request object until free(request)
    or reset(): its request_id, each item's offset and length when the item first appears, its
    identifier, get_num_embeds() and is_embed only when a call first needs the
    item (it is in the step's window, named in an allocation, or freed by size),
    so items a prefix-cache hit covers are never read. mm_features must be
    sorted by offset. Callbacks run while the manager is busy: they must not
    call back into it (that raises RuntimeError).
    """

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
        """Items to encode for tokens [num_computed_tokens, num_computed_tokens
        + num_new_tokens); hits are taken and evictions made as in vLLM, even if
        the step is then cut short. A cached size that disagrees with the
        request's is passed to on_mismatch and returns ([], 0, budget, [], [])."""
    def allocate_encoder_inputs(
        self, request: _Request, input_ids: Sequence[int], duplicate_input_ids: Sequence[int]
    ) -> None:
        """allocate() each of input_ids, then check_and_update_cache() each
        duplicate. Ids are checked first (IndexError, nothing changed)."""
    def free_encoder_inputs_before(self, request: _Request, position: int) -> list[int]:
        """Free the request's cached inputs whose placeholders end at or before
        position (vLLM: num_computed_tokens - num_output_placeholders); return
        their ids, ascending."""

class EncoderCacheManager(_StepMethods):
    """vLLM 0.33's encoder-cache manager, in Rust."""

    def __init__(self, cache_size: int) -> None: ...
    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> EncoderCacheManager: ...
    def reset(self) -> None: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool: ...
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> int | None: ...
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool: ...
    def allocate(self, request: _Request, input_id: int) -> None: ...
    def get_cached_input_ids(self, request: _Request) -> set[int]:
        """The request's cached input ids, in a set that is the caller's own
        (never changed by the manager afterwards)."""
    def free_encoder_input(self, request: _Request, input_id: int) -> None: ...
    def free(self, request: _Request) -> None: ...
    def get_freed_mm_hashes(self) -> list[str]: ...
    def get_manager_metadata(self) -> None: ...
    @property
    def cache_size(self) -> int: ...
    @property
    def num_free_slots(self) -> int: ...
    @property
    def num_freeable_slots(self) -> int: ...
    @property
    def cached(self) -> dict[str, set[str]]: ...
    @property
    def num_embeds_by_hash(self) -> dict[str, int]: ...
    @property
    def freeable(self) -> dict[str, int]: ...
    @property
    def request_cached_ids(self) -> dict[str, set[int]]: ...
    @property
    def request_hash_refs(self) -> dict[str, dict[str, int]]: ...
    @property
    def freed(self) -> list[str]: ...
    def check_invariants(self) -> None:
        """Raise ``encoder_cache.InvariantError`` naming the first broken bookkeeping rule."""
    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain, JSON-able data (shape: see RELIABILITY.md)."""
    @classmethod
    def restore(cls, state: dict[str, Any]) -> EncoderCacheManager:
        """A manager in a ``snapshot()``'s state; ValueError if it is inconsistent."""

class EncoderDecoderCacheManager(_StepMethods):
    """vLLM 0.33's scheduling-only manager for encoder-decoder models, in Rust.

    Step-level API: every item is in the window until the first decoder token
    and none after; free_encoder_inputs_before frees every item once
    request.num_computed_tokens > 0."""

    def __init__(self, cache_size: int) -> None: ...
    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> EncoderDecoderCacheManager: ...
    def reset(self) -> None: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool: ...
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> None: ...
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool: ...
    def allocate(self, request: _Request, input_id: int) -> None: ...
    def get_cached_input_ids(self, request: _Request) -> set[int]: ...
    def free_encoder_input(self, request: _Request, input_id: int) -> None: ...
    def free(self, request: _Request) -> None: ...
    def get_freed_mm_hashes(self) -> list[str]: ...
    def get_manager_metadata(self) -> None: ...
    @property
    def cache_size(self) -> int: ...
    @property
    def num_free_slots(self) -> int: ...
    @property
    def allocated(self) -> list[str]: ...
    @property
    def to_free(self) -> list[str]: ...
    def check_invariants(self) -> None:
        """Never raises: this bookkeeping has no rule beyond its types."""
    def snapshot(self) -> dict[str, Any]: ...
    @classmethod
    def restore(cls, state: dict[str, Any]) -> EncoderDecoderCacheManager: ...

def _panic_for_test() -> None:
    """Private test hook: panics in Rust, surfacing as pyo3's PanicException."""

class _CallFloor:
    """Private benchmark aid: the manager's methods, changing nothing. With
    ``reads=True`` each reads from the request what vLLM's manager reads on every call."""

    def __init__(self, *, reads: bool = False) -> None: ...
    def check_and_update_cache(self, request: _Request, input_id: int) -> bool: ...
    def can_allocate(
        self, request: _Request, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool: ...
    def get_cached_num_encoder_embeds(self, request: _Request, input_id: int) -> None: ...
    def get_cached_input_ids(self, request: _Request) -> None: ...
    def allocate(self, request: _Request, input_id: int) -> None: ...
    def free_encoder_input(self, request: _Request, input_id: int) -> None: ...
    def free(self, request: _Request) -> None: ...
    def _panic_for_test(self, request: object) -> None:
        """Private test hook: panics in Rust inside a fast entry, surfacing as pyo3's PanicException."""
