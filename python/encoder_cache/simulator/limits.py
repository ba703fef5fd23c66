"""The scheduler's limits (vLLM's ``SchedulerConfig`` fields the simulator
models) and the encoder budget vLLM derives from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoder_cache.budget import SchedulerConfig, compute_mm_encoder_budget
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE
from encoder_cache.simulator.workloads import option

__all__ = ["SchedulerLimits"]


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's limits; the encoder ones default to ``max_num_batched_tokens``, as in vLLM."""

    # Defaults: vLLM's for `vllm serve` on an H100-class GPU.
    max_num_batched_tokens: int = option(8192, "token budget of one step", "N")
    max_num_seqs: int = option(256, "most requests running at once", "N")
    max_num_encoder_input_tokens: int | None = option(
        None, "encoder compute budget per step, in embeddings (default: the token budget)", "N"
    )
    encoder_cache_size: int | None = option(None, "encoder cache size, in embeddings (default: the token budget)", "N")
    kv_capacity: int = option(
        262144, "KV-cache capacity in tokens (16-token blocks); when full the newest request is preempted", "N"
    )
    prefix_caching: bool = field(default=True, metadata={"cli": False})
    #: vLLM's ``async_scheduling`` (its default): the next step is scheduled
    #: before the previous step's output comes back.
    async_scheduling: bool = field(default=True, metadata={"cli": False})
    #: vLLM's ``scheduler_reserve_full_isl`` (its default): a waiting request is
    #: admitted only when its whole prompt fits in free blocks, not just its first chunk.
    reserve_full_isl: bool = field(default=True, metadata={"cli": False})

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, bool) and value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.kv_capacity < 2 * BLOCK_SIZE:
            raise ValueError(
                f"kv_capacity must be at least two blocks ({2 * BLOCK_SIZE} tokens: vLLM keeps one out of the "
                f"pool), got {self.kv_capacity}"
            )

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV pool can hold: ``kv_capacity`` in whole blocks, less the
        one block vLLM keeps out of the pool (its null block)."""
        return (self.kv_capacity // BLOCK_SIZE - 1) * BLOCK_SIZE

    def encoder_budget(self, max_embeds_per_item: dict[str, int]) -> tuple[int, int]:
        """``(encoder_compute_budget, encoder_cache_size)`` as vLLM derives them."""
        config = SchedulerConfig(
            self.max_num_batched_tokens, self.max_num_encoder_input_tokens, self.encoder_cache_size
        )
        return compute_mm_encoder_budget(config, max_embeds_per_item)
