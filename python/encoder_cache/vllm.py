"""Plug encoder-cache into vLLM 0.33.

Two independent switches, both named by qualified class name in vLLM's config:

- ``encoder_cache.vllm.EncoderCacheManager`` for
  ``EncoderCacheManagerConfig.encoder_cache_manager_cls``: vLLM's scheduler
  keeps its own per-item loop but every cache operation runs in Rust.
- ``encoder_cache.vllm.AsyncScheduler`` (async scheduling, vLLM's default)
  or ``encoder_cache.vllm.Scheduler`` (``--no-async-scheduling``) for
  ``SchedulerConfig.scheduler_cls``: vLLM's scheduler with the per-item
  encoder loops replaced by one Rust call per request per step (it brings the
  Rust manager with it).

This is the only module of the package that imports vLLM. Importing it
without vLLM, or with a vLLM outside the 0.33 series, raises ImportError; set
``ENCODER_CACHE_ALLOW_VLLM_VERSION`` to the exact installed version to accept
that version at your own risk.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import encoder_cache._core as _core
from encoder_cache.observed import OBSERVE_KEYS, ObserveOptions, observed_class
from encoder_cache.step_api import StepResult

SUPPORTED_SERIES = "0.33"
VERSION_OVERRIDE_ENV = "ENCODER_CACHE_ALLOW_VLLM_VERSION"
_INSTALL_HINT = f"pip install 'vllm=={SUPPORTED_SERIES}.*'"


def _check_vllm() -> None:
    try:
        import vllm
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "vllm":
            raise ImportError(
                f"encoder_cache.vllm needs vLLM {SUPPORTED_SERIES}.x, which is not installed: {_INSTALL_HINT}"
            ) from exc
        raise ImportError(f"vLLM is installed but failed to import ({exc}); encoder_cache.vllm needs it") from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    supported = version == SUPPORTED_SERIES or version.startswith(SUPPORTED_SERIES + ".")
    if not supported and os.environ.get(VERSION_OVERRIDE_ENV) != version:
        raise ImportError(
            f"encoder_cache.vllm supports vLLM {SUPPORTED_SERIES}.x only, found {version}: the manager hook and "
            f"the scheduler's private methods it replaces are version-specific. Install {_INSTALL_HINT}, or set "
            f"{VERSION_OVERRIDE_ENV}={version} to try this version anyway."
        )


_check_vllm()

from vllm.v1.core.sched.async_scheduler import AsyncScheduler as _VllmAsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler  # noqa: E402

__all__ = [
    "OPTION_KEYS",
    "SUPPORTED_SERIES",
    "VERSION_OVERRIDE_ENV",
    "AsyncScheduler",
    "EncoderCacheManager",
    "ManagerOptions",
    "Scheduler",
]


#: The ``manager_config`` keys ``EncoderCacheManager`` takes (see ``ManagerOptions``).
OPTION_KEYS = ("cache_size", "cache_gib", "policy", "lookahead", "log_stats_interval", *OBSERVE_KEYS)

# A child of vLLM's "vllm" logger, so its lines go where vLLM's own go.
_logger = logging.getLogger("vllm.encoder_cache")

#: True while one of this module's schedulers is being built: a manager created
#: then is driven by a scheduler that marks the waiting requests (lookahead).
_building_marking_scheduler = contextvars.ContextVar("encoder_cache_building_marking_scheduler", default=False)

LOOKAHEAD_NEEDS_SCHEDULER = (
    "manager_config lookahead needs the scheduler that marks waiting requests, and vLLM's own scheduler does not: "
    "add --scheduler-cls encoder_cache.vllm.AsyncScheduler (or encoder_cache.vllm.Scheduler with "
    "--no-async-scheduling), or leave lookahead out"
)


@dataclass(frozen=True)
class ManagerOptions:
    """``ec_manager_config.manager_config``, checked.

    - ``cache_size``: capacity in encoder embeddings, or ``cache_gib``: in GiB
      of encoder outputs (converted with the model's embedding size and dtype);
      at most one of them; neither keeps vLLM's size.
    - ``policy``: a name from ``encoder_cache.POLICIES``, or ``"auto"`` for the
      recommended one (default ``"vllm"``).
    - ``lookahead``: the scheduler subclasses mark the items of waiting
      requests, which are then evicted last (default False). Only they do,
      so the manager refuses it under any other scheduler.
    - ``log_stats_interval``: seconds between the cache's log lines (hits,
      misses, re-encodes, evictions); 0 turns them off (default 60).
    - ``observe``: the Prometheus and cache-event keys (``metrics_port``,
      ``events_endpoint``, ...; see ``encoder_cache.observed.ObserveOptions``).
    """

    cache_size: int | None = None
    cache_gib: float | None = None
    policy: str = "vllm"
    lookahead: bool = False
    log_stats_interval: float = 60.0
    observe: ObserveOptions = ObserveOptions()

    @classmethod
    def parse(cls, options: Any) -> ManagerOptions:
        """The options in ``options``; ValueError naming the key for anything else."""
        if not isinstance(options, dict):
            raise ValueError(f"manager_config must be a dict, got {type(options).__name__}")
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise ValueError(f"unknown manager_config key {unknown[0]!r}; the keys are {', '.join(OPTION_KEYS)}")
        if "cache_size" in options and "cache_gib" in options:
            raise ValueError("manager_config takes cache_size or cache_gib, not both")
        size = options.get("cache_size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(f"manager_config cache_size must be a positive int (embeddings), got {size!r}")
        gib = options.get("cache_gib")
        if gib is not None and (isinstance(gib, bool) or not isinstance(gib, (int, float)) or not 0 < gib < math.inf):
            raise ValueError(f"manager_config cache_gib must be a positive number (GiB), got {gib!r}")
        policy = options.get("policy", "vllm")
        if policy not in (*_core.POLICIES, "auto"):
            raise ValueError(
                f"manager_config policy must be one of {', '.join(_core.POLICIES)} or auto, got {policy!r}"
            )
        lookahead = options.get("lookahead", False)
        if not isinstance(lookahead, bool):
            raise ValueError(f"manager_config lookahead must be true or false, got {lookahead!r}")
        interval = options.get("log_stats_interval", 60.0)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < math.inf:
            raise ValueError(f"manager_config log_stats_interval must be a number of seconds >= 0, got {interval!r}")
        observe = ObserveOptions.parse(options)
        return cls(size, None if gib is None else float(gib), policy, lookahead, float(interval), observe)


def embed_bytes(vllm_config: Any) -> int:
    """Bytes one encoder embedding takes on the GPU: the model's embedding size times its dtype's."""
    model = vllm_config.model_config
    return int(model.get_inputs_embeds_size()) * int(model.dtype.itemsize)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class EncoderCacheManager(_core.EncoderCacheManager):
    """The class to name in ``ec_manager_config.encoder_cache_manager_cls``.

    It is the Rust ``encoder_cache.EncoderCacheManager``, configured from
    ``manager_config`` (``ManagerOptions``); ``create_manager`` returns the
    Rust ``EncoderDecoderCacheManager`` instead when the model is
    encoder-decoder, as vLLM does for its own classes.
    """

    #: Whether the scheduler subclasses mark waiting requests' items (``lookahead``).
    lookahead: bool = False

    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> Any:
        if vllm_config is None:
            return cls(cache_size)
        options = ManagerOptions.parse(vllm_config.ec_manager_config.manager_config)
        per_embed = embed_bytes(vllm_config)
        size = cache_size
        if options.cache_size is not None:
            size = options.cache_size
        elif options.cache_gib is not None:
            size = max(1, int(options.cache_gib * 2**30 // per_embed))
        if vllm_config.model_config.is_encoder_decoder:
            if options.policy != "vllm" or options.lookahead or options.observe.events_endpoint is not None:
                raise ValueError(
                    "manager_config policy, lookahead and events_endpoint apply to models whose encoder outputs "
                    "are shared; an encoder-decoder model's are not: leave them out"
                )
            return _core.EncoderDecoderCacheManager(size)
        if options.lookahead and not _building_marking_scheduler.get():
            raise ValueError(LOOKAHEAD_NEEDS_SCHEDULER)
        observers = options.observe.observers(
            engine=int(getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_index", 0) or 0),
            model_name=str(getattr(vllm_config.model_config, "served_model_name", "") or ""),
            log=_log_stats,
            log_interval=options.log_stats_interval,
            announce=_logger.info,
        )
        manager = (observed_class(cls) if observers.per_step else cls)(size, policy=options.policy)
        if observers.per_step or observers.events is not None:
            manager.observers = observers  # closed by the scheduler subclasses' shutdown()
        if observers.events is not None:
            observers.events.watch(manager)
        manager.lookahead = options.lookahead
        _log_capacity(size, cache_size, per_embed, options)
        return manager


def _log_stats(stats: dict[str, Any]) -> None:
    _logger.info("%s", stats_line(stats))


def stats_line(stats: dict[str, Any]) -> str:
    """One log line of ``manager.stats()``."""
    looked_up = stats["hits"] + stats["misses"]
    hit_rate = f"{stats['hits'] / looked_up:.1%}" if looked_up else "n/a"
    return (
        f"encoder cache: hit rate {hit_rate} ({stats['hits']} hits, {stats['misses']} misses), "
        f"{stats['reencodes']} re-encodes ({stats['reencode_embeds']} embeddings), "
        f"{stats['evictions']} evictions, {stats['entries']} entries using {stats['used_embeds']} embeddings"
    )


def _log_capacity(size: int, vllm_size: int, per_embed: int, options: ManagerOptions) -> None:
    _logger.info(
        "encoder cache: %d embeddings (%s at %d bytes each), policy %s, lookahead %s",
        size,
        _gib(size * per_embed),
        per_embed,
        options.policy,
        "on" if options.lookahead else "off",
    )
    extra = (size - vllm_size) * per_embed
    if extra > 0:
        _logger.warning(
            "encoder cache: %s more than the %d embeddings (%s) vLLM planned GPU memory for; lower "
            "--gpu-memory-utilization by that share of the GPU's memory (for example %.3f on an 80 GiB GPU)",
            _gib(extra),
            vllm_size,
            _gib(vllm_size * per_embed),
            extra / (80 * 2**30),
        )


#: The empty input lists of a step that schedules nothing, answered without Rust: an empty
#: tuple, which costs nothing to make. vLLM's ``schedule()`` only tests these for truth (it
#: concatenates or stores them only when one is not empty, and those come from Rust as lists).
_NO_INPUTS: Any = ()


class _StepLevelEncoderInputs:
    """The encoder-input loops of vLLM 0.33's scheduler, done in Rust.

    ``_try_schedule_encoder_inputs``, ``_allocate_encoder_inputs`` and
    ``_free_encoder_inputs`` each become at most one call to the manager's
    step-level API; the EC connector calls, vLLM's mismatch warning and its
    rejected-request bookkeeping are kept. With no ``encoder_cache_manager_cls``
    configured, the scheduler installs ``encoder_cache.vllm.EncoderCacheManager``.

    Most calls need no Rust at all. vLLM calls the first and the last of these
    methods for every running request with multimodal items on every step, but
    once a request's computed tokens are past its last item (it is decoding)
    there is nothing to schedule, and once it has freed what it held there is
    nothing to free: those calls return here, from a few attribute reads,
    where vLLM's own methods compute a feature window or build a set.
    ``_drained`` holds the ids of requests known to hold no cache entry; a
    request leaves it whenever a Rust call could give it one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        building = _building_marking_scheduler.set(True)
        try:
            super().__init__(*args, **kwargs)
            self._drained: set[str] = set()
            self._ensure_step_level_manager()
        finally:
            _building_marking_scheduler.reset(building)

    def _ensure_step_level_manager(self) -> None:
        """Keep a configured manager with the step-level API; install ours when none is configured."""
        manager = self.encoder_cache_manager
        if hasattr(manager, "try_schedule_encoder_inputs"):
            return
        if self.vllm_config.ec_manager_config.encoder_cache_manager_cls is not None:
            raise TypeError(
                f"{type(self).__module__}.{type(self).__qualname__} needs an encoder cache manager with the "
                f"step-level API (try_schedule_encoder_inputs, ...); {type(manager).__qualname__} has none. "
                "Configure encoder_cache.vllm.EncoderCacheManager or leave encoder_cache_manager_cls unset."
            )
        self.encoder_cache_manager = EncoderCacheManager.create_manager(
            cache_size=manager.cache_size, vllm_config=self.vllm_config
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.encoder_cache_manager, "lookahead", False):
            self._mark_waiting_requests()
        return super().schedule(*args, **kwargs)

    def _mark_waiting_requests(self) -> None:
        """Keeps the manager's lookahead marks equal to the waiting queue's
        requests with encoder inputs (new, and preempted ones put back),
        before the step's evictions: O(waiting requests) per step, and one
        prefix-cache lookup per request marked. Items inside a request's
        cached KV prefix, which it will never look up, are not marked."""
        manager = self.encoder_cache_manager
        marked: dict[str, Any] = self.__dict__.setdefault("_waiting_marks", {})
        waiting = {}
        for queue in (self.waiting, getattr(self, "kv_holding_waiting", ())):
            for request in queue:
                if request.mm_features:
                    waiting[request.request_id] = request
        for request_id in [r for r in marked if waiting.get(r) is not marked[r]]:
            manager.unmark_waiting(marked.pop(request_id))
        for request_id, request in waiting.items():
            if request_id not in marked:
                manager.mark_waiting(request, self._cached_prefix_tokens(request))
                marked[request_id] = request

    def _cached_prefix_tokens(self, request: Any) -> int:
        """Where waiting ``request`` would start now: the tokens its KV
        prefix-cache hit covers (found as vLLM's admission finds it, short of
        the last prompt token), or its computed tokens if more."""
        kv_cache = self.kv_cache_manager
        hit = 0
        if kv_cache.prefix_cache_lookup_enabled(request):
            _, hit, _ = kv_cache.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return max(hit, request.num_computed_tokens)

    def _try_schedule_encoder_inputs(
        self,
        request: Any,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
    ) -> StepResult:
        # vLLM's window is empty for a step of no tokens and once the computed tokens are past
        # every item: checked first against the prompt's end, as every placeholder lies in the
        # prompt (each decoding step returns there), then against the last item's end.
        if not self.is_encoder_decoder and (
            num_computed_tokens >= request.num_prompt_tokens
            or not num_new_tokens
            or not (features := request.mm_features)
            or num_computed_tokens >= (last := features[-1].mm_position).offset + last.length
        ):
            return _NO_INPUTS, num_new_tokens, encoder_compute_budget, _NO_INPUTS, _NO_INPUTS
        self._drained.discard(request.request_id)
        connector = self.ec_connector
        return self.encoder_cache_manager.try_schedule_encoder_inputs(
            request,
            num_computed_tokens,
            num_new_tokens,
            encoder_compute_budget,
            shift_computed_tokens,
            disable_chunked_mm_input=self.scheduler_config.disable_chunked_mm_input,
            has_remote_item=None if connector is None else connector.has_cache_item,
            on_mismatch=self._reject_on_encoder_cache_embed_mismatch,
        )

    def _allocate_encoder_inputs(self, request: Any, input_ids: list[int], duplicate_input_ids: list[int]) -> None:
        self._drained.discard(request.request_id)
        self.encoder_cache_manager.allocate_encoder_inputs(request, input_ids, duplicate_input_ids)
        connector = self.ec_connector
        if connector is not None:
            for input_id in input_ids:
                connector.update_state_after_alloc(request, input_id)

    def _free_encoder_inputs(self, request: Any) -> None:
        request_id = request.request_id
        drained = self._drained
        if request_id in drained:
            return
        # Inputs whose placeholders end before the confirmed progress (in-flight
        # output placeholders excluded) are in the KV cache and can go.
        position = request.num_computed_tokens - request.num_output_placeholders
        freed = self.encoder_cache_manager.free_encoder_inputs_before(request, position)
        connector = self.ec_connector
        if connector is not None:
            for input_id in freed:
                connector.update_state_after_free(request, input_id)
        features = request.mm_features
        if features and not self.is_encoder_decoder:
            last = features[-1].mm_position
            if position >= last.offset + last.length:
                drained.add(request_id)  # every item it could hold ends before position

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._drained.discard(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        super().shutdown()
        observers = getattr(self.encoder_cache_manager, "observers", None)
        if observers is not None:
            observers.close()  # sends what the event publisher holds, then closes its sockets


class Scheduler(_StepLevelEncoderInputs, _VllmScheduler):
    """vLLM's ``Scheduler`` (``--no-async-scheduling``) with the Rust encoder-input steps."""


class AsyncScheduler(_StepLevelEncoderInputs, _VllmAsyncScheduler):
    """vLLM's ``AsyncScheduler`` (async scheduling, the default) with the Rust encoder-input steps."""


# The host-tier connector (encoder_cache.host_tier), loaded on first use since it imports vLLM's
# connector modules; not in __all__ for that reason.
_HOST_TIER_NAMES = ("ECCPUConnector", "HostTierConnector")


def __getattr__(name: str) -> Any:
    if name in _HOST_TIER_NAMES:
        from encoder_cache import host_tier

        return getattr(host_tier, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
