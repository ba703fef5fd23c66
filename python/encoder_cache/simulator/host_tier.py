"""The host-memory tier in the simulator: vLLM 0.33's ``ECCPUConnector``
(``ec_role="ec_both"``) as its scheduler side drives it, with the block
bookkeeping in ``encoder_cache.HostBlockCache``, the same cache
``encoder_cache.vllm.HostTierConnector`` runs inside vLLM.

The scheduler side, step by step, as the engine calls it:

- When a request needs an item the GPU encoder cache does not hold (and the
  cache and the encoder budget could take it), the scheduler asks
  ``has_cache_item``: an entry that exists and is ready means the item is
  loaded from host memory instead of encoded. A load does not spend the
  encoder budget; it still takes its place in the GPU encoder cache.
- After the GPU encoder cache allocates an item (``update_state_after_alloc``,
  encoded or loaded alike): an item the region has no entry for gets one,
  not ready, for the save of its encoder output; allocation may evict ready,
  unpinned entries in the policy's order, and fails (the item is simply not
  saved) when even that would not make room. An item whose entry is ready is
  pinned for its load.
- When the step's output is processed (a step later with async scheduling),
  the worker has reported its copies: saved entries become ready (and
  evictable), loaded ones are unpinned.

The region is cut into blocks of one embedding row each (the model's hidden
size times the dtype's bytes), so an item of ``n`` embeddings takes ``n``
blocks and the region holds ``ec_cpu_bytes // bytes_per_embed`` of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from encoder_cache import HOST_POLICIES, HostBlockCache

__all__ = ["HOST_POLICIES", "HostTier", "HostTierCounters", "HostTierModel", "ec_transfer_config"]

_GIB = 1 << 30


@dataclass(frozen=True)
class HostTier:
    """A host tier's configuration: its size in bytes, its eviction policy, and
    the bytes of one block (one embedding row)."""

    size_bytes: int
    policy: str = "fifo"
    bytes_per_embed: int = 7168

    def __post_init__(self) -> None:
        if self.policy not in HOST_POLICIES:
            raise ValueError(f"host-tier policy must be one of {', '.join(HOST_POLICIES)}, got {self.policy!r}")
        for name in ("size_bytes", "bytes_per_embed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"host tier {name} must be an int > 0, got {value!r}")
        if self.size_bytes < self.bytes_per_embed:
            raise ValueError(
                f"a host tier of {self.size_bytes:,} bytes holds no block of {self.bytes_per_embed:,} bytes"
            )

    @property
    def num_blocks(self) -> int:
        return self.size_bytes // self.bytes_per_embed

    @property
    def gib(self) -> float:
        return self.size_bytes / _GIB

    @property
    def label(self) -> str:
        return f"host {self.gib:g} GiB {self.policy}"


def ec_transfer_config(tier: HostTier) -> dict[str, Any]:
    """The ``--ec-transfer-config`` that turns this host tier on in vLLM (docs/vllm.md)."""
    return {
        "ec_connector": "HostTierConnector",
        "ec_connector_module_path": "encoder_cache.vllm",
        "ec_role": "ec_both",
        "ec_connector_extra_config": {"ec_cpu_bytes": tier.size_bytes, "ec_cpu_policy": tier.policy},
    }


@dataclass
class HostTierCounters:
    """What the host tier did in one run."""

    #: Items loaded from host memory instead of encoded, and their embeddings.
    loads: int = 0
    loaded_embeds: int = 0
    #: Items the GPU needed that the host tier did not hold ready (encoded instead).
    misses: int = 0
    #: Encoder outputs saved to host memory, and those not saved for want of space.
    saves: int = 0
    saved_embeds: int = 0
    save_failures: int = 0
    evictions: int = 0
    #: The most embeddings loaded in one step.
    peak_step_loaded_embeds: int = 0
    bytes_per_embed: int = 0

    @property
    def hit_rate(self) -> float:
        """Loads over the items the GPU asked the host tier for."""
        asked = self.loads + self.misses
        return self.loads / asked if asked else 0.0

    @property
    def loaded_bytes(self) -> int:
        return self.loaded_embeds * self.bytes_per_embed

    def load_gib_per_second(self, steps: int, step_seconds: float) -> float:
        """The host-to-GPU load volume over the run, per second of ``steps`` steps of ``step_seconds``."""
        seconds = steps * step_seconds
        return self.loaded_bytes / _GIB / seconds if seconds else 0.0

    def peak_gib_per_second(self, step_seconds: float) -> float:
        """The busiest step's loads, as a rate over one step."""
        return self.peak_step_loaded_embeds * self.bytes_per_embed / _GIB / step_seconds if step_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "loads": self.loads,
            "loaded_embeds": self.loaded_embeds,
            "loaded_gib": self.loaded_bytes / _GIB,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "saves": self.saves,
            "saved_embeds": self.saved_embeds,
            "save_failures": self.save_failures,
            "evictions": self.evictions,
            "peak_step_loaded_embeds": self.peak_step_loaded_embeds,
        }


class HostTierModel:
    """The connector's scheduler side over a block cache (``HostBlockCache`` by
    default; ``cache`` takes anything with vLLM's ``EmbeddingCache`` API).
    ``on_decision`` (tests) is told ``("load" | "save" | "unsaved", identifier)``."""

    def __init__(
        self,
        tier: HostTier,
        cache: Any = None,
        on_decision: Callable[[str, str], None] | None = None,
    ) -> None:
        self.tier = tier
        self.cache = HostBlockCache(tier.num_blocks, policy=tier.policy) if cache is None else cache
        self.counters = HostTierCounters(bytes_per_embed=tier.bytes_per_embed)
        self.on_decision = on_decision
        self._saves: list[str] = []
        self._loads: dict[str, int] = {}
        self._step_loaded = 0

    def has_cache_item(self, identifier: str) -> bool:
        entry = self.cache.get(identifier)
        return entry is not None and entry.ready

    def missed(self, num_items: int) -> None:
        """``num_items`` items were encoded: the host tier did not have them ready."""
        self.counters.misses += num_items

    def after_alloc(self, identifier: str, num_embeds: int) -> None:
        """The GPU encoder cache allocated ``identifier`` (encoded or loaded)."""
        cache, c = self.cache, self.counters
        entry = cache.get(identifier)
        if entry is None:
            before = self._evictions()
            shape = (num_embeds, self.tier.bytes_per_embed)
            if cache.alloc(identifier, num_embeds, shape) is None:
                c.save_failures += 1
                self._decided("unsaved", identifier)
            else:
                self._saves.append(identifier)
                c.saves += 1
                c.saved_embeds += num_embeds
                c.evictions += self._evictions() - before
                self._decided("save", identifier)
            return
        if entry.ready and identifier not in self._loads:
            cache.pin(identifier)
            self._loads[identifier] = num_embeds
            c.loads += 1
            c.loaded_embeds += num_embeds
            self._step_loaded += num_embeds
            self._decided("load", identifier)

    def take_step(self) -> tuple[list[str], list[str]]:
        """The step is scheduled (``build_connector_meta``): its saves and loads go to the worker."""
        work = (self._saves, list(self._loads))
        self._saves = []
        self._loads = {}
        if self._step_loaded > self.counters.peak_step_loaded_embeds:
            self.counters.peak_step_loaded_embeds = self._step_loaded
        self._step_loaded = 0
        return work

    def completed(self, work: tuple[list[str], list[str]]) -> None:
        """The worker reports a step's copies done: saves become ready, loads are unpinned."""
        saves, loads = work
        for identifier in saves:
            if self.cache.get(identifier) is not None:
                self.cache.mark_ready(identifier)
        for identifier in loads:
            self.cache.unpin(identifier)

    def _evictions(self) -> int:
        stats = getattr(self.cache, "stats", None)
        if stats is None:
            return 0
        value = stats()
        return int(value["evictions"] if isinstance(value, dict) else value.evictions)

    def _decided(self, what: str, identifier: str) -> None:
        if self.on_decision is not None:
            self.on_decision(what, identifier)
