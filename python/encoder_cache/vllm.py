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

import os
from typing import Any

import encoder_cache._core as _core
from encoder_cache.reference import StepResult

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

__all__ = ["SUPPORTED_SERIES", "VERSION_OVERRIDE_ENV", "AsyncScheduler", "EncoderCacheManager", "Scheduler"]


class EncoderCacheManager(_core.EncoderCacheManager):
    """The class to name in ``ec_manager_config.encoder_cache_manager_cls``.

    It is the Rust ``encoder_cache.EncoderCacheManager``; ``create_manager``
    returns the Rust ``EncoderDecoderCacheManager`` instead when the model is
    encoder-decoder, as vLLM does for its own classes. It has no options:
    ``manager_config`` must be empty.
    """

    __slots__ = ()

    @classmethod
    def create_manager(cls, *, cache_size: int, vllm_config: Any = None) -> Any:
        if vllm_config is None:
            return cls(cache_size)
        options = vllm_config.ec_manager_config.manager_config
        if options:
            raise ValueError(
                f"{cls.__module__}.{cls.__qualname__} takes no manager_config options, got {sorted(options)!r}; "
                "pass an empty manager_config"
            )
        if vllm_config.model_config.is_encoder_decoder:
            return _core.EncoderDecoderCacheManager(cache_size)
        return cls(cache_size)


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
        super().__init__(*args, **kwargs)
        self._drained: set[str] = set()
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

    def _try_schedule_encoder_inputs(
        self,
        request: Any,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
    ) -> StepResult:
        if not self.is_encoder_decoder:
            features = request.mm_features
            if not num_new_tokens or not features:
                return [], num_new_tokens, encoder_compute_budget, [], []
            last = features[-1].mm_position
            if num_computed_tokens >= last.offset + last.length:
                # Past every item (features are sorted): vLLM's window is empty.
                return [], num_new_tokens, encoder_compute_budget, [], []
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


class Scheduler(_StepLevelEncoderInputs, _VllmScheduler):
    """vLLM's ``Scheduler`` (``--no-async-scheduling``) with the Rust encoder-input steps."""


class AsyncScheduler(_StepLevelEncoderInputs, _VllmAsyncScheduler):
    """vLLM's ``AsyncScheduler`` (async scheduling, the default) with the Rust encoder-input steps."""
