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

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import encoder_cache.vllm as _hook
from encoder_cache._core import HOST_POLICIES, HostBlockCache

#: The vLLM series this connector is written for: importing encoder_cache.vllm
#: above refused any other with an ImportError saying what to install.
SUPPORTED_SERIES = _hook.SUPPORTED_SERIES

from vllm.distributed.ec_transfer.ec_connector.cpu.connector import (  # noqa: E402
    ECCPUConnector as _VllmECCPUConnector,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.scheduler import (  # noqa: E402
    ECCPUScheduler as _VllmECCPUScheduler,
)

__all__ = [
    "HOST_POLICIES",
    "LOG_INTERVAL_KEY",
    "POLICY_KEY",
    "SUPPORTED_SERIES",
    "ECCPUConnector",
    "HostTierConnector",
    "HostTierOptions",
    "HostTierScheduler",
    "stats_line",
]

#: The ``ec_connector_extra_config`` key naming the host tier's eviction policy.
POLICY_KEY = "ec_cpu_policy"
#: The key of the seconds between the host tier's log lines (0: none).
LOG_INTERVAL_KEY = "ec_cpu_log_stats_interval"

_logger = logging.getLogger("vllm.encoder_cache")


@dataclass(frozen=True)
class HostTierOptions:
    """Our keys of ``ec_connector_extra_config`` (vLLM's own, such as
    ``ec_cpu_bytes``, are vLLM's to check).

    - ``ec_cpu_policy``: a name from ``HOST_POLICIES`` (default ``"fifo"``).
    - ``ec_cpu_log_stats_interval``: seconds between the host tier's log
      lines (loads, saves, evictions, fill); 0 turns them off (default 60).
    """

    policy: str = "fifo"
    log_stats_interval: float = 60.0

    @classmethod
    def parse(cls, ec_transfer_config: Any) -> HostTierOptions:
        """The options of ``ec_transfer_config``; ValueError naming the key for a bad value."""
        extra = getattr(ec_transfer_config, "ec_connector_extra_config", None) or {}
        policy = extra.get(POLICY_KEY, HOST_POLICIES[0])
        if policy not in HOST_POLICIES:
            raise ValueError(
                f"ec_connector_extra_config {POLICY_KEY} must be one of {', '.join(HOST_POLICIES)}, got {policy!r}"
            )
        interval = extra.get(LOG_INTERVAL_KEY, 60.0)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < math.inf:
            raise ValueError(
                f"ec_connector_extra_config {LOG_INTERVAL_KEY} must be a number of seconds >= 0, got {interval!r}"
            )
        return cls(str(policy), float(interval))


def stats_line(stats: dict[str, int], num_blocks: int) -> str:
    """One log line of ``HostBlockCache.stats()``."""
    used = num_blocks - stats["free_blocks"]
    return (
        f"encoder cache host tier: {stats['pins']} loads, {stats['allocs']} saves "
        f"({stats['alloc_failures']} not saved for want of space), {stats['evictions']} evictions, "
        f"{stats['entries']} entries using {used} of {num_blocks} blocks"
    )


class HostTierScheduler(_VllmECCPUScheduler):
    """vLLM's scheduler-side delegate of the ``ECCPUConnector``, its block
    bookkeeping in a ``HostBlockCache`` under the configured policy."""

    def __init__(self, vllm_config: Any) -> None:
        # Checked before vLLM maps the region, so a bad value leaves nothing behind.
        self._host_options = HostTierOptions.parse(vllm_config.ec_transfer_config)
        self._next_log = 0.0
        super().__init__(vllm_config)
        self._use_host_block_cache()
        _logger.info(
            "encoder cache host tier: %d blocks of %d bytes, policy %s",
            self._region.num_blocks,
            self._region.block_size_bytes,
            self._host_options.policy,
        )

    def _setup_nixl(self, vllm_config: Any) -> None:
        # vLLM's NIXL producer session keeps the cache it is given: give it ours.
        self._use_host_block_cache()
        super()._setup_nixl(vllm_config)

    def _use_host_block_cache(self) -> None:
        if not isinstance(self._cache, HostBlockCache):
            self._cache = HostBlockCache(self._region.num_blocks, policy=self._host_options.policy)

    @property
    def host_cache(self) -> HostBlockCache:
        """The block cache of the host region (``stats()``, ``eviction_order()``, ...)."""
        return self._cache

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        # Once per scheduler step: the place to log the counters now and then.
        interval = self._host_options.log_stats_interval
        if interval:
            now = time.monotonic()
            if now >= self._next_log:
                if self._next_log:
                    _logger.info("%s", stats_line(self._cache.stats(), self._cache.num_blocks))
                self._next_log = now + interval
        return super().build_connector_meta(scheduler_output)


class HostTierConnector(_VllmECCPUConnector):
    """vLLM 0.33's ``ECCPUConnector`` with the host region's bookkeeping in
    Rust and a choice of eviction policy (``ec_cpu_policy``)."""

    def _make_scheduler(self, vllm_config: Any) -> HostTierScheduler:
        return HostTierScheduler(vllm_config)


#: The name the host-tier connector goes by in encoder-cache's documentation.
#: Configure ``HostTierConnector``: vLLM maps the name ``ECCPUConnector`` to its own class.
ECCPUConnector = HostTierConnector
