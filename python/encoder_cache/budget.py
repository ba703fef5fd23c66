"""Encoder compute budget and cache size, as vLLM 0.33 derives them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SchedulerConfig", "compute_mm_encoder_budget"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler limits the budget depends on (vLLM's ``SchedulerConfig`` fields).

    The encoder limits default to ``max_num_batched_tokens``, as in vLLM.
    """

    max_num_batched_tokens: int
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    disable_chunked_mm_input: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.max_num_batched_tokens)


def compute_mm_encoder_budget(scheduler_config: Any, mm_max_toks_per_item: Mapping[str, int]) -> tuple[int, int]:
    """Return ``(encoder_compute_budget, encoder_cache_size)`` in embeddings.

    Both are raised to at least the largest item any modality can produce, so
    a single item always fits. With no modality enabled there is no encoder
    cache: ``(0, 0)``. ``scheduler_config`` is vLLM's ``SchedulerConfig`` or
    this module's.
    """
    if not mm_max_toks_per_item:
        logger.warning("no multimodal modality is enabled; the encoder cache is not used")
        return 0, 0
    largest_item = max(mm_max_toks_per_item.values())
    if scheduler_config.disable_chunked_mm_input and largest_item > scheduler_config.max_num_batched_tokens:
        raise ValueError(
            f"chunked multimodal input is disabled, so an item of {largest_item} tokens must fit in one step, "
            f"but max_num_batched_tokens is {scheduler_config.max_num_batched_tokens}; raise max_num_batched_tokens"
        )
    return (
        max(scheduler_config.max_num_encoder_input_tokens, largest_item),
        max(scheduler_config.encoder_cache_size, largest_item),
    )
