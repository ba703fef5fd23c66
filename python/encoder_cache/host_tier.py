"""The host-memory tier of vLLM 0.33's ``ECCPUConnector``, with a Rust block cache.

vLLM's ``ECCPUConnector`` (``ec_role="ec_both"``) copies each encoder output
it computes into a shared host-memory region and, when a later request needs
the item again and the GPU encoder cache no longer holds it, loads it back
from there instead of running the encoder. Its scheduler side keeps the
region's bookkeeping in ``EmbeddingCache``, which evicts first in, first out.

``HostTierConnector`` is vLLM's connector with that bookkeeping replaced by
``encoder_cache.HostBlockCache`` (Rust): the same entry states (not ready
while a save is in flight, ready, pinned while loads read it), the same block
allocation, and the eviction policy named by ``ec_cpu_policy`` in
``ec_connector_extra_config`` (``HOST_POLICIES``; ``"fifo"``, the default,
makes exactly vLLM's decisions). Everything else (the region, the worker's
copies, the metadata, NIXL) is vLLM's.

Load it through ``encoder_cache.vllm`` (see docs/vllm.md)::

    --ec-transfer-config '{"ec_connector": "HostTierConnector",
        "ec_connector_module_path": "encoder_cache.vllm", "ec_role": "ec_both",
        "ec_connector_extra_config": {"ec_cpu_bytes": 8589934592, "ec_cpu_policy": "s3fifo"}}'

The name ``ECCPUConnector`` is vLLM's own registered connector: vLLM resolves
it to its class before it looks at ``ec_connector_module_path``, so the
configuration must name ``HostTierConnector`` (``encoder_cache.vllm``
exports this class under both names).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.ec_transfer.ec_connector.cpu.connector import ECCPUConnector as _VllmECCPUConnector
from vllm.distributed.ec_transfer.ec_connector.cpu.scheduler import ECCPUScheduler as _VllmECCPUScheduler

import encoder_cache.vllm  # noqa: F401  (checks that the installed vLLM is a supported one)
from encoder_cache._core import HOST_POLICIES, HostBlockCache

__all__ = ["HOST_POLICIES", "POLICY_KEY", "ECCPUConnector", "HostTierConnector", "HostTierScheduler", "host_policy"]

#: The ``ec_connector_extra_config`` key naming the host tier's eviction policy.
POLICY_KEY = "ec_cpu_policy"


def host_policy(ec_transfer_config: Any) -> str:
    """The policy ``ec_connector_extra_config`` names (default ``"fifo"``);
    ValueError naming the key for anything but a name in ``HOST_POLICIES``."""
    extra = getattr(ec_transfer_config, "ec_connector_extra_config", None) or {}
    policy = extra.get(POLICY_KEY, HOST_POLICIES[0])
    if policy not in HOST_POLICIES:
        raise ValueError(
            f"ec_connector_extra_config {POLICY_KEY} must be one of {', '.join(HOST_POLICIES)}, got {policy!r}"
        )
    return str(policy)


class HostTierScheduler(_VllmECCPUScheduler):
    """vLLM's scheduler-side delegate of the ``ECCPUConnector``, its block
    bookkeeping in a ``HostBlockCache`` under the configured policy."""

    def __init__(self, vllm_config: Any) -> None:
        # Checked before vLLM maps the region, so a bad value leaves nothing behind.
        self._host_policy = host_policy(vllm_config.ec_transfer_config)
        super().__init__(vllm_config)
        self._use_host_block_cache()

    def _setup_nixl(self, vllm_config: Any) -> None:
        # vLLM's NIXL producer session keeps the cache it is given: give it ours.
        self._use_host_block_cache()
        super()._setup_nixl(vllm_config)

    def _use_host_block_cache(self) -> None:
        if not isinstance(self._cache, HostBlockCache):
            self._cache = HostBlockCache(self._region.num_blocks, policy=self._host_policy)

    @property
    def host_cache(self) -> HostBlockCache:
        """The block cache of the host region (``stats()``, ``eviction_order()``, ...)."""
        return self._cache


class HostTierConnector(_VllmECCPUConnector):
    """vLLM 0.33's ``ECCPUConnector`` with the host region's bookkeeping in
    Rust and a choice of eviction policy (``ec_cpu_policy``)."""

    def _make_scheduler(self, vllm_config: Any) -> HostTierScheduler:
        return HostTierScheduler(vllm_config)


#: The name the host-tier connector goes by in encoder-cache's documentation.
#: Configure ``HostTierConnector``: vLLM maps the name ``ECCPUConnector`` to its own class.
ECCPUConnector = HostTierConnector
