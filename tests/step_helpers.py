"""Shared by the step-level tests: a placeholder shaped like vLLM's, and the
managers' readable state."""

from __future__ import annotations

from typing import Any

import numpy as np


class ArrayPlaceholder:
    """vLLM 0.33's ``PlaceholderRange`` behaviour with ``is_embed`` as an array
    (vLLM uses a torch bool tensor; numpy has the same ``.tolist()``)."""

    def __init__(self, offset: int, length: int, is_embed: Any = None) -> None:
        self.offset = offset
        self.length = length
        self.is_embed = None if is_embed is None else np.asarray(is_embed, dtype=bool)

    def _cumsum(self) -> list[int] | None:
        return None if self.is_embed is None else np.cumsum(self.is_embed).tolist()

    def get_num_embeds(self) -> int:
        cumsum = self._cumsum()
        if cumsum is None:
            return self.length
        return cumsum[-1] if cumsum else 0

    def get_embeds_indices_in_range(self, start_idx: int, end_idx: int) -> tuple[int, int]:
        cumsum = self._cumsum()
        if cumsum is None:
            return start_idx, end_idx
        return (cumsum[start_idx - 1] if start_idx > 0 else 0), (cumsum[end_idx - 1] if end_idx > 0 else 0)


def snapshot(manager: Any) -> dict[str, Any]:
    """Every readable field, in comparable form (eviction order included)."""
    state: dict[str, Any] = {"cache_size": manager.cache_size, "num_free_slots": manager.num_free_slots}
    if hasattr(manager, "to_free"):
        state.update(allocated=list(manager.allocated), to_free=list(manager.to_free))
        return state
    state.update(
        num_freeable_slots=manager.num_freeable_slots,
        cached={k: set(v) for k, v in manager.cached.items()},
        num_embeds_by_hash=dict(manager.num_embeds_by_hash),
        freeable=list(manager.freeable.items()),
        request_cached_ids={k: set(v) for k, v in manager.request_cached_ids.items()},
        request_hash_refs={k: dict(v) for k, v in manager.request_hash_refs.items() if v},
        freed=list(manager.freed),
    )
    return state
