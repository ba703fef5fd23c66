"""Invariants a run verifies with ``check=True``: slow, they snapshot the
manager's state. Each raises ``SimulationError`` naming what broke."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from encoder_cache.request import Request
from encoder_cache.simulator import oracle
from encoder_cache.simulator.prefix_cache import BlockPool
from encoder_cache.simulator.results import SimulationError

__all__ = ["cache", "released", "window"]


def window(manager: Any, request: Request, first: int, last: int, to_encode: list[int]) -> None:
    """Items ``first..last`` overlap the step's tokens: each is encoded now or cached."""
    if any(not first <= i < last for i in to_encode):
        raise SimulationError(f"{request.request_id}: items {to_encode} to encode lie outside the step")
    for i in range(first, last):
        if manager.get_cached_num_encoder_embeds(request, i) != request.get_num_encoder_embeds(i):
            raise SimulationError(f"{request.request_id}: item {i} is scheduled but neither encoded nor in the cache")


def cache(manager: Any, step: int, pool: BlockPool, active: set[str], held: Iterable[list[int]]) -> None:
    """After a step: the manager's own invariants, its slots add up, only
    ``active`` requests hold entries, and the KV blocks ``held`` by running
    requests and the free ones add up to the pool."""
    m = manager
    try:
        if not isinstance(getattr(m, "_policy", None), oracle.OraclePolicy):  # the twin checks built-ins only
            m.check_invariants()
    except Exception as exc:
        raise SimulationError(f"step {step}: {exc}") from None
    snapshot = m.snapshot()
    entries = snapshot["entries"]
    if m.num_free_slots + sum(e["num_embeds"] for e in entries.values()) != m.cache_size:
        raise SimulationError(f"step {step}: cached entries and free slots do not add up to the cache size")
    holders = {r for e in entries.values() for r in e["referrers"]}
    if not holders <= active:
        raise SimulationError(f"step {step}: finished requests {sorted(holders - active)} still hold entries")
    if pool.num_free + len({b for blocks in held for b in blocks}) != pool.num_usable:
        raise SimulationError(f"step {step}: KV blocks held and free do not add up")


def released(manager: Any, pool: BlockPool) -> None:
    """After the run: no references and no KV blocks are left."""
    snapshot = manager.snapshot()
    if any(e["referrers"] for e in snapshot["entries"].values()) or manager.num_freeable_slots != manager.cache_size:
        raise SimulationError("references are left after every request finished")
    if pool.num_free != pool.num_usable:
        raise SimulationError("KV blocks are left after every request finished")
