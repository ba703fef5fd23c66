"""The manager variants a simulation compares: an eviction policy (or the
offline ``oracle``), lookahead marks or not, the implementation (Rust or the
Python twin) and the release behaviour, and the factory that builds each one's
manager at a given cache size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import encoder_cache
from encoder_cache import _core, reference
from encoder_cache.simulator import oracle
from encoder_cache.simulator.host_tier import HostTier

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "MANAGERS",
    "UNBOUNDED",
    "Variant",
    "available_policies",
    "supports_lookahead",
]

IMPLEMENTATIONS = ("rust", "python")
#: fixed: vLLM 0.33 (PR #54284's fix, O(1) occurrence counts); prefix: before
#: the fix; scan: the fix as the PR first wrote it (scans on every free).
BEHAVIOURS = ("fixed", "prefix", "scan")
#: Managers other than the policies, by (implementation, behaviour): the
#: seed-bug comparison's, and any a test registers (a factory of cache_size).
MANAGERS: dict[tuple[str, str], Callable[[int], Any]] = {
    ("python", "prefix"): reference.PreFixEncoderCacheManager,
    ("python", "scan"): reference.AnyScanEncoderCacheManager,
}
#: A cache size no workload fills: every item is encoded once, then kept.
UNBOUNDED = 1 << 40


def available_policies(implementation: str = "rust") -> tuple[str, ...]:
    """The eviction policies the implementation offers (``("vllm",)`` when it has no choice)."""
    module = encoder_cache if implementation == "rust" else reference
    policies = getattr(module, "POLICIES", None)
    if policies is None and implementation == "rust":
        policies = getattr(_core, "POLICIES", None)
    return tuple(policies) if policies else ("vllm",)


def supports_lookahead(implementation: str = "rust") -> bool:
    cls = _core.EncoderCacheManager if implementation == "rust" else reference.EncoderCacheManager
    return hasattr(cls, "mark_waiting") and hasattr(cls, "unmark_waiting")


@dataclass(frozen=True)
class Variant:
    """One manager configuration: an eviction policy (or ``oracle``), lookahead
    marks or not, the implementation, the release behaviour, and a host tier or none."""

    policy: str = "vllm"
    lookahead: bool = False
    implementation: str = "rust"
    behaviour: str = "fixed"
    #: The name to show, when the policy alone does not tell variants apart.
    label: str | None = None
    #: A host-memory tier behind the GPU encoder cache (vLLM's ECCPUConnector), or none.
    host: HostTier | None = None

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        name = self.policy + ("+lookahead" if self.lookahead else "")
        return name if self.host is None else f"{name} + {self.host.label}"

    def manager(self, cache_size: int, future: Any = None) -> Any:
        if self.behaviour != "fixed":
            factory = MANAGERS.get((self.implementation, self.behaviour))
            if factory is None or self.policy != "vllm" or self.lookahead:
                raise ValueError(f"the {self.behaviour} behaviour exists only in python with the vllm policy")
            return factory(cache_size)
        if self.policy == "oracle":
            if not oracle.AVAILABLE:
                raise ValueError("the oracle needs a manager with pluggable policies (encoder_cache.policies)")
            return reference.EncoderCacheManager(cache_size, policy=oracle.OraclePolicy(future))
        cls = _core.EncoderCacheManager if self.implementation == "rust" else reference.EncoderCacheManager
        if self.lookahead and not supports_lookahead(self.implementation):
            raise ValueError(f"the {self.implementation} manager has no mark_waiting/unmark_waiting")
        offered = available_policies(self.implementation)
        if self.policy not in offered:
            raise ValueError(f"no policy {self.policy!r} in the {self.implementation} manager; it offers {offered}")
        if offered == ("vllm",):
            return cls(cache_size)
        return cls(cache_size, policy=self.policy)
