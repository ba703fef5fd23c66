"""The twin of the encoder-decoder manager (Whisper's cross-attention inputs)."""

from __future__ import annotations

import operator
from typing import Any

from encoder_cache.invariants import InvariantError
from encoder_cache.reference.checks import count, rust_debug
from encoder_cache.reference.manager import EncoderCacheManager
from encoder_cache.reference.request_fields import input_index, read_identifier, read_num_embeds, read_request_id
from encoder_cache.reference.state import check_encoder_decoder_state, parse_encoder_decoder_state


class EncoderDecoderCacheManager(EncoderCacheManager):
    """vLLM 0.33's scheduling-only manager for encoder-decoder models, with
    each held input freed once (vLLM adds its size back on every free)."""

    is_encoder_decoder = True

    def __init__(self, cache_size: int) -> None:
        self._cache_size = count(cache_size, "cache_size")
        self.num_free_slots = self._cache_size
        #: request id -> input id -> embeddings, for inputs allocated and not freed yet.
        self.held: dict[str, dict[int, int]] = {}
        self.allocated: list[str] = []
        self.to_free: list[str] = []

    @property
    def cache_size(self) -> int:
        """The capacity in embeddings. Assigning resizes: ValueError, changing
        nothing, below what the held inputs take."""
        return self._cache_size

    @cache_size.setter
    def cache_size(self, value: int) -> None:
        value = count(value, "cache_size")
        used = self._cache_size - self.num_free_slots
        if value < used:
            raise ValueError(
                f"cannot resize the cache to {value} embeddings: entries in use take {used}; "
                f"free requests first or choose a size of at least {used}"
            )
        self.num_free_slots = value - used
        self._cache_size = value

    @property
    def policy(self) -> str:
        """Always ``"vllm"``: nothing is shared, so nothing is evicted."""
        return "vllm"

    def reset(self) -> None:
        self.num_free_slots = self._cache_size
        self.held.clear()
        self.allocated.clear()
        self.to_free.clear()

    def check_and_update_cache(self, request: Any, input_id: int) -> bool:
        return False

    def get_cached_num_encoder_embeds(self, request: Any, input_id: int) -> int | None:
        return None

    def can_allocate(
        self, request: Any, input_id: int, encoder_compute_budget: int, num_embeds_to_schedule: int
    ) -> bool:
        num_embeds = read_num_embeds(request, input_index(input_id))
        if num_embeds > operator.index(encoder_compute_budget):
            return False
        return num_embeds + operator.index(num_embeds_to_schedule) <= self.num_free_slots

    def allocate(self, request: Any, input_id: int) -> None:
        input_id = input_index(input_id)
        num_embeds = read_num_embeds(request, input_id)
        mm_hash = read_identifier(request, input_id)
        request_id = read_request_id(request)
        self._allocate(request_id, input_id, mm_hash, num_embeds)

    def _allocate(self, request_id: str, input_id: int, mm_hash: str, num_embeds: int) -> None:
        if num_embeds > self.num_free_slots:
            raise ValueError(
                f"cannot allocate {num_embeds} embeddings for item {rust_debug(mm_hash)}: {self.num_free_slots} slots free, "
                f"{self.num_free_slots} reclaimable; call can_allocate first so it can evict"
            )
        if input_id in self.held.get(request_id, {}):
            raise ValueError(
                f"request '{request_id}' already holds input {input_id}; free it before allocating it again"
            )
        self.held.setdefault(request_id, {})[input_id] = num_embeds
        self.num_free_slots -= num_embeds
        self.allocated.append(mm_hash)

    def get_cached_input_ids(self, request: Any) -> set[int]:
        return set(self.held.get(read_request_id(request), ()))

    def free_encoder_input(self, request: Any, input_id: int) -> None:
        input_id = input_index(input_id)
        request_id = read_request_id(request)
        inputs = self.held.get(request_id, {})
        if input_id not in inputs:
            read_identifier(request, input_id)  # an input the request does not have is still an error
            return
        self.num_free_slots += inputs.pop(input_id)
        if not inputs:
            del self.held[request_id]

    def free(self, request: Any) -> None:
        inputs = self.held.pop(read_request_id(request), {})
        self.num_free_slots += sum(inputs.values())

    def get_freed_mm_hashes(self) -> list[str]:
        to_free, self.to_free, self.allocated = self.to_free, self.allocated, []
        self._run_step_hook()
        return to_free

    def check_invariants(self) -> None:
        check_encoder_decoder_state(parse_encoder_decoder_state(self.snapshot()))

    def snapshot(self) -> dict[str, Any]:
        return {
            "cache_size": self._cache_size,
            "num_free_slots": self.num_free_slots,
            "held": {request: [[i, n] for i, n in sorted(inputs.items())] for request, inputs in self.held.items()},
            "allocated": list(self.allocated),
            "to_free": list(self.to_free),
        }

    @classmethod
    def restore(cls, state: Any) -> EncoderDecoderCacheManager:
        state = parse_encoder_decoder_state(state)
        try:
            check_encoder_decoder_state(state)
        except InvariantError as err:
            raise ValueError(f"inconsistent state: {err}") from None
        manager = cls(state["cache_size"])
        manager.num_free_slots = state["num_free_slots"]
        manager.held = {request: inputs for request, inputs in state["held"].items() if inputs}
        manager.allocated = state["allocated"]
        manager.to_free = state["to_free"]
        return manager

    def _consumed(self, request: Any, placeholder: Any, position: int) -> bool:
        # Cross-attention has the encoder output once the first decoder token is computed.
        return request.num_computed_tokens > 0 or super()._consumed(request, placeholder, position)
