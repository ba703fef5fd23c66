"""``--engine vllm``: replay a workload through vLLM 0.33's own scheduler.

The built-in model reimplements vLLM's scheduling rules; this engine runs
vLLM's real ``Scheduler`` (``AsyncScheduler`` with async scheduling) instead,
on CPU, to check the model or to answer with vLLM's own code:

- no GPU and no weights: a tiny LLaVA-shaped ``config.json`` is written to a
  temporary directory and read by vLLM's ``ModelConfig`` (no tokenizer); the
  KV cache is one full-attention group of 16-token blocks, sized from
  ``--kv-capacity``;
- vLLM's multimodal registry is replaced by a stand-in that reports the
  workload's largest item per modality, which is all the scheduler asks it
  (to size the encoder budget and cache);
- requests get concrete token ids (``tokens.py``), items their identifiers
  and placeholder ranges, and vLLM's own block hasher;
- the model's outputs are fake: a request past its prompt samples exactly the
  next token of its answer, so it decodes ``output_tokens`` tokens and a
  session's next turn finds them in its prompt;
- our manager is plugged in through vLLM's hooks: ``scheduler_cls`` is
  ``encoder_cache.vllm.Scheduler`` (``AsyncScheduler``) and
  ``ec_manager_config`` names ``encoder_cache.vllm.EncoderCacheManager`` with
  the variant's policy, lookahead and cache size;
- the engine loop is vLLM's: one scheduled step, then its output, or with
  async scheduling vLLM's two-deep batch queue (the next step is scheduled
  before the previous step's output is processed).

Arrivals and think times are released as the built-in model releases them,
and the counters are taken from each ``SchedulerOutput``, so the two engines'
results compare field by field.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from types import SimpleNamespace
from typing import Any

from encoder_cache.simulator.arrivals import Arrivals
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.ledger import Ledger
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE
from encoder_cache.simulator.prompts import Prompts, materialize
from encoder_cache.simulator.results import Counters, RunResult, SimulationError
from encoder_cache.simulator.spec import RequestSpec
from encoder_cache.simulator.variants import Variant

__all__ = ["INSTALL_HINT", "EngineUnavailable", "check_variant", "require", "scheduler_for", "simulate_vllm"]

INSTALL_HINT = (
    "pip install 'vllm==0.33.*' into this environment (CPU is enough: no GPU and no model download "
    "are needed; docs/vllm.md shows a separate environment)"
)

#: The tiny model's vocabulary: materialized token ids lie below it.
_VOCAB = 32064
#: The LLaVA config's image token (the scheduler never reads it).
_IMAGE_TOKEN = 32000


class EngineUnavailable(RuntimeError):
    """``--engine vllm`` without a usable vLLM 0.33."""


def require() -> None:
    """Raise EngineUnavailable, saying what to install, unless vLLM 0.33 imports."""
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "vllm":
            raise EngineUnavailable(f"--engine vllm: vLLM is installed but fails to import: {exc}") from None
        raise EngineUnavailable(
            f"--engine vllm replays through vLLM 0.33's own scheduler, and vLLM is not installed here: {INSTALL_HINT}"
        ) from None
    except ImportError as exc:
        raise EngineUnavailable(f"--engine vllm: vLLM is installed but fails to import: {exc}") from None
    try:
        import encoder_cache.vllm  # noqa: F401  (checks vLLM's version)
    except ImportError as exc:
        raise EngineUnavailable(f"--engine vllm: {exc}") from None


def check_variant(variant: Variant) -> None:
    """ValueError unless vLLM's hooks can run ``variant`` (the compiled manager's policies)."""
    if variant.policy == "oracle":
        raise ValueError("the oracle exists in the built-in model only; --engine vllm runs real policies")
    if variant.behaviour != "fixed" or variant.implementation != "rust":
        raise ValueError(
            "--engine vllm plugs in encoder_cache.vllm.EncoderCacheManager (the compiled manager): "
            "the python implementation and other behaviours run in the built-in model only"
        )


# --- the scheduler, as `vllm serve` builds it, on CPU --------------------------------------


def _model_config(directory: Path, max_model_len: int) -> Any:
    from vllm.config import ModelConfig

    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": _IMAGE_TOKEN,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 4,
            "vocab_size": _VOCAB,
            "max_position_embeddings": max_model_len,
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "image_size": 336,
            "patch_size": 14,
            "projection_dim": 64,
        },
    }
    (directory / "config.json").write_text(json.dumps(config))
    return ModelConfig(
        model=str(directory), skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=max_model_len
    )


class _Registry:
    """Stands in for vLLM's multimodal registry: it reports the largest item per modality."""

    def __init__(self, max_embeds: dict[str, int]) -> None:
        self.max_embeds = dict(max_embeds) or {"image": 1}

    def create_processor(self, model_config: Any, **_: Any) -> Any:
        info = SimpleNamespace(
            supported_mm_limits=dict.fromkeys(self.max_embeds),
            allowed_mm_limits=dict.fromkeys(self.max_embeds, 1 << 16),
            get_mm_max_tokens_per_item=lambda seq_len, mm_counts: dict(self.max_embeds),
            ctx=SimpleNamespace(model_config=model_config),
        )
        return SimpleNamespace(info=info)


def _scheduler(
    directory: Path,
    limits: SchedulerLimits,
    variant: Variant,
    cache_size: int,
    max_embeds: dict[str, int],
    max_model_len: int,
) -> Any:
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
    from vllm.config.ec_manager_config import EncoderCacheManagerConfig

    model = _model_config(directory, max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=limits.async_scheduling,
        scheduler_cls="encoder_cache.vllm." + ("AsyncScheduler" if limits.async_scheduling else "Scheduler"),
        scheduler_reserve_full_isl=limits.reserve_full_isl,
        is_multimodal_model=True,
        is_encoder_decoder=False,
    )
    if limits.max_num_encoder_input_tokens is not None:
        scheduler_config.max_num_encoder_input_tokens = limits.max_num_encoder_input_tokens
    if limits.encoder_cache_size is not None:
        scheduler_config.encoder_cache_size = limits.encoder_cache_size
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=limits.prefix_caching)
    manager_config = {
        "policy": variant.policy,
        "lookahead": variant.lookahead,
        "cache_size": cache_size,
        "log_stats_interval": 0,
    }
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        ec_manager_config=EncoderCacheManagerConfig(
            encoder_cache_manager_cls="encoder_cache.vllm.EncoderCacheManager", manager_config=manager_config
        ),
    )
    return scheduler_for(vllm_config, limits.kv_capacity // BLOCK_SIZE, _Registry(max_embeds))


def scheduler_for(vllm_config: Any, num_blocks: int, mm_registry: Any) -> Any:
    """The scheduler class ``vllm_config`` names, built as vLLM's engine core
    builds it, over a KV pool of ``num_blocks`` blocks of one full-attention
    layer (no tensors: the scheduler only does bookkeeping)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = vllm_config.cache_config.block_size
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        mm_registry=mm_registry,
    )


# --- the replay ------------------------------------------------------------------------------


class _Live:
    """A request handed to vLLM, with what the counters need."""

    __slots__ = ("answer", "ends", "running", "served", "spec", "starts", "vllm")

    def __init__(self, spec: RequestSpec, request: Any, answer: list[int]) -> None:
        self.spec = spec
        self.vllm = request
        self.answer = answer  # the token ids it decodes, in order
        self.starts = [item.offset for item in spec.items]
        self.ends = [item.offset + item.length for item in spec.items]
        self.served = [False] * len(spec.items)
        self.running = False


class _Replay:
    def __init__(
        self,
        workload: Any,
        scheduler: Any,
        cost: EncoderCost,
        in_flight: int,
        progress: Callable[[int], None] | None,
        check: bool,
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self._sampling_params = SamplingParams
        init_none_hash(sha256)
        self.block_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.scheduler = scheduler
        self.cost = cost
        self.in_flight = in_flight
        self.progress = progress
        self.check = check
        self.caching = scheduler.cache_config.enable_prefix_caching
        self.arrivals = Arrivals(workload.requests())
        self.counters = Counters()
        self.clock = 0
        self.live: dict[str, _Live] = {}
        self.prompts = Prompts()
        self.emitted: dict[str, int] = {}
        self.ledger = Ledger(self.counters, cost)
        self.scheduler_seconds = 0.0

    def _arrive(self, spec: RequestSpec) -> None:
        from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
        from vllm.v1.request import Request

        tokens = materialize(spec, self.prompts.runs(spec), _VOCAB)
        features = [
            MultiModalFeatureSpec(
                data=MultiModalKwargsItem.dummy(),
                modality=item.modality,
                identifier=item.identifier,
                mm_position=PlaceholderRange(offset=item.offset, length=item.length),
            )
            for item in spec.items
        ]
        request = Request(
            request_id=spec.request_id,
            prompt_token_ids=tokens.prompt_token_ids,
            sampling_params=self._sampling_params(max_tokens=spec.output_tokens, ignore_eos=True),
            pooling_params=None,
            mm_features=features,
            block_hasher=self.block_hasher,
        )
        self.ledger.arrived(spec)
        self.live[spec.request_id] = _Live(spec, request, tokens.output_token_ids)
        self.emitted[spec.request_id] = 0
        self.scheduler.add_request(request)

    def _model_output(self, output: Any) -> Any:
        """What the model would return for ``output``: the next answer token of
        every request past its prompt, nothing for a prefill chunk."""
        from vllm.v1.outputs import ModelRunnerOutput

        requests = self.scheduler.requests
        req_ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            if requests[req_id].is_prefill_chunk:
                sampled.append([])
                continue
            n = self.emitted[req_id]
            self.emitted[req_id] = n + 1
            sampled.append([self.live[req_id].answer[n]])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _account(self, output: Any) -> None:
        """Counters for one scheduled step."""
        c, ledger = self.counters, self.ledger
        for req_id in output.preempted_req_ids or ():
            live = self.live[req_id]
            live.running = False
            ledger.restarted(live.spec, live.served)
            c.preemptions += 1
        encoder_inputs = output.scheduled_encoder_inputs
        for req_id, num_new in output.num_scheduled_tokens.items():
            live = self.live[req_id]
            computed = live.vllm.num_computed_tokens - num_new  # vLLM advanced it when it scheduled the step
            if not live.running:
                live.running = True
                if self.caching:
                    c.prefix_query_tokens += live.vllm.num_tokens
                    c.prefix_hit_tokens += computed
                if computed:
                    ledger.admitted(live.spec, live.served, live.ends, computed)
            to_encode = encoder_inputs.get(req_id, [])
            ledger.scheduled(live.spec, live.served, live.starts, live.ends, computed, num_new, to_encode)
        c.evictions += len(output.free_encoder_mm_hashes)

    def _finish(self, engine_outputs: dict[int, Any]) -> None:
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                if o.finish_reason is None:
                    continue
                live = self.live.pop(o.request_id)
                self.emitted.pop(o.request_id)
                self.counters.requests += 1
                self.arrivals.finished(live.spec, self.clock)

    def run(self) -> None:
        scheduler, arrivals, c = self.scheduler, self.arrivals, self.counters
        batches: deque[tuple[Any, Any]] = deque()
        idle_schedules = 0
        while True:
            for spec in arrivals.due(self.clock):
                self._arrive(spec)
            if not scheduler.get_num_unfinished_requests() and not batches:
                when = arrivals.next_event()
                if when is None:
                    if arrivals.in_flight:
                        raise SimulationError(f"{arrivals.in_flight} requests wait for session turns that never finish")
                    break
                self.clock = max(when, self.clock + 1)
                continue
            # One engine step, as vLLM's engine core takes it (a batch queue of
            # depth 2 with async scheduling, else schedule then update).
            scheduled = False
            if scheduler.has_requests():
                waiting = len(scheduler.waiting) + len(scheduler.kv_holding_waiting)
                start = perf_counter()
                output = scheduler.schedule()
                self.scheduler_seconds += perf_counter() - start
                scheduled = output.total_num_scheduled_tokens > 0
                if scheduled:
                    c.steps += 1
                    c.waiting_steps += waiting > 0
                    idle_schedules = 0
                else:
                    idle_schedules += 1
                    if idle_schedules > 1000:
                        raise SimulationError(
                            f"vLLM's scheduler stalled at step {c.steps}: "
                            f"{len(scheduler.running)} running and {len(scheduler.waiting)} waiting requests"
                        )
                self._account(output)
                batches.appendleft((output, self._model_output(output)))
                if len(batches) < self.in_flight and (scheduled or scheduler.has_requests()):
                    self.clock += 1
                    continue
            if batches:
                output, model_output = batches.pop()
                start = perf_counter()
                engine_outputs = scheduler.update_from_output(output, model_output)
                self.scheduler_seconds += perf_counter() - start
                self._finish(engine_outputs)
            self.clock += 1
            if self.check:
                try:
                    scheduler.encoder_cache_manager.check_invariants()
                except Exception as exc:
                    raise SimulationError(f"step {c.steps}: {exc}") from None
            if self.progress is not None and c.steps % 64 == 0:
                self.progress(c.requests)
        if self.progress is not None:
            self.progress(c.requests)


@contextlib.contextmanager
def _quiet() -> Any:
    """vLLM's log lines (a custom scheduler class, our hook's capacity notes,
    which warn about the sweep's huge sizes) say nothing about the replay: keep errors only."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def simulate_vllm(
    workload: Any,
    limits: SchedulerLimits,
    variant: Variant | None = None,
    *,
    cache_size: int | None = None,
    cost: EncoderCost | None = None,
    check: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay ``workload`` through vLLM's scheduler with one manager variant;
    the result has the built-in model's counters. ``cache_size`` overrides the
    encoder cache size vLLM would derive; ``limits`` also say whether
    scheduling is async and admission reserves the whole prompt; ``check``
    verifies the manager's invariants after every step."""
    require()
    variant = Variant() if variant is None else variant
    check_variant(variant)
    cost = EncoderCost() if cost is None else cost
    max_embeds = workload.max_embeds_per_item()
    compute_budget, derived_size = limits.encoder_budget(max_embeds)
    size = derived_size if cache_size is None else max(cache_size, *max_embeds.values(), 1)
    max_tokens = max((spec.total_tokens for spec in workload.requests()), default=1)
    max_model_len = -(-(max_tokens + 1) // BLOCK_SIZE) * BLOCK_SIZE
    with _quiet(), tempfile.TemporaryDirectory(prefix="encoder-cache-vllm-") as directory:
        scheduler = _scheduler(
            Path(directory),
            limits,
            variant,
            size,
            max_embeds,
            max_model_len,
        )
    manager = scheduler.encoder_cache_manager
    replay = _Replay(workload, scheduler, cost, 2 if limits.async_scheduling else 1, progress, check)
    start = perf_counter()
    with _quiet():
        replay.run()
    wall = perf_counter() - start
    stats = manager.stats() if hasattr(manager, "stats") else None
    return RunResult(
        variant, compute_budget, manager.cache_size, replay.counters, replay.scheduler_seconds, wall, stats
    )
