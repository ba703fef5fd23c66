"""Drive vLLM 0.33's real Scheduler on CPU with multimodal requests and fake
model outputs. Shared by tests/test_vllm_real.py and
benches/bench_vllm_scheduler.py; importing it imports vLLM.

How the scheduler is built here (no GPU, no download, no weights):

- the model is a LLaVA-shaped ``config.json`` written to a temporary
  directory and read by vLLM's own ``ModelConfig`` (``skip_tokenizer_init``):
  vLLM sees a decoder-only multimodal model;
- ``DeviceConfig(device="cpu")``: a CUDA wheel cannot infer a device without a GPU;
- the multimodal registry handed to ``Scheduler(mm_registry=...)`` is a
  stand-in. vLLM's LLaVA processor needs a real tokenizer; the scheduler only
  asks it for the tokens per image, to size the encoder budget and cache
  (``MultiModalBudget``), and that number is what the stand-in answers;
- one full-attention KV-cache group, as vLLM's own scheduler tests build it.

Everything else (scheduling, prefix caching, preemption, the encoder-cache
calls, ``update_from_output``) is vLLM's code.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from vllm.config import CacheConfig, DeviceConfig, ECTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.config.ec_manager_config import EncoderCacheManagerConfig
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from encoder_cache.simulator.vllm_engine import scheduler_for

#: How each variant is switched on: (ec_manager_config's class, scheduler_cls by async flag).
VARIANTS: dict[str, tuple[str | None, dict[bool, str | None]]] = {
    "stock": (None, {False: None, True: None}),
    "manager": ("encoder_cache.vllm.EncoderCacheManager", {False: None, True: None}),
    "scheduler": (None, {False: "encoder_cache.vllm.Scheduler", True: "encoder_cache.vllm.AsyncScheduler"}),
}

BLOCK_SIZE = 16
IMAGE_TOKEN = 32000
SAMPLED_TOKEN = 7  # every fake model output; follow-up turns quote it, so prefixes match

_LLAVA_CONFIG = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_index": IMAGE_TOKEN,
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
        "vocab_size": 32064,
        "max_position_embeddings": 8192,
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


_WHISPER_CONFIG = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "is_encoder_decoder": True,
    "d_model": 64,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "vocab_size": 51865,
    "decoder_start_token_id": 50258,
    "pad_token_id": 50257,
    "bos_token_id": 50257,
    "eos_token_id": 50257,
}


def model_config(directory: Path, encoder_decoder: bool = False) -> ModelConfig:
    """vLLM's ModelConfig for a weightless model written to ``directory``:
    LLaVA-shaped, or Whisper-shaped when ``encoder_decoder``."""
    config, max_model_len = (_WHISPER_CONFIG, 448) if encoder_decoder else (_LLAVA_CONFIG, 8192)
    (directory / "config.json").write_text(json.dumps(config))
    return ModelConfig(
        model=str(directory), skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=max_model_len
    )


class _ImageRegistry:
    """Stands in for vLLM's multimodal registry: images of at most ``max_tokens`` tokens."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens

    def create_processor(self, model_config: ModelConfig, **_: Any) -> Any:
        info = SimpleNamespace(
            supported_mm_limits={"image": None},
            allowed_mm_limits={"image": 64},
            get_mm_max_tokens_per_item=lambda seq_len, mm_counts: {"image": self.max_tokens},
            ctx=SimpleNamespace(model_config=model_config),
        )
        return SimpleNamespace(info=info)


@dataclass(frozen=True)
class Setup:
    """Scheduler limits of one scenario (the encoder ones are in embeddings)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_image_tokens: int = 128
    encoder_cache_size: int = 384
    encoder_compute_budget: int = 256
    num_blocks: int = 2000
    disable_chunked_mm_input: bool = False
    async_scheduling: bool = False
    # A directory for vLLM's example EC connector, as a consumer: items stored
    # there are loaded from it instead of encoded.
    ec_storage: str | None = None


def build_scheduler(
    variant: str,
    model: ModelConfig,
    setup: Setup,
    manager_cls: str | None = None,
    manager_config: dict[str, Any] | None = None,
) -> Any:
    """vLLM's scheduler for ``variant`` (see VARIANTS), resolved from the config as
    vLLM's engine does. ``manager_cls`` overrides the variant's manager class;
    ``manager_config`` is passed to it through vLLM's config."""
    variant_manager, scheduler_cls = VARIANTS[variant]
    manager_cls = manager_cls or variant_manager
    scheduler_config = SchedulerConfig(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        enable_chunked_prefill=True,
        disable_chunked_mm_input=setup.disable_chunked_mm_input,
        async_scheduling=setup.async_scheduling,
        scheduler_cls=scheduler_cls[setup.async_scheduling],
        # As vLLM's EngineArgs fills them in (encoder-decoder turns chunked prefill off).
        is_multimodal_model=model.is_multimodal_model,
        is_encoder_decoder=model.is_encoder_decoder,
    )
    # Fields vLLM derives from the token budget; set small so the cache must evict.
    scheduler_config.encoder_cache_size = setup.encoder_cache_size
    scheduler_config.max_num_encoder_input_tokens = setup.encoder_compute_budget
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    ec_transfer_config = None
    if setup.ec_storage is not None:
        ec_transfer_config = ECTransferConfig(
            ec_connector="ECExampleConnector",
            ec_role="ec_consumer",
            ec_connector_extra_config={"shared_storage_path": setup.ec_storage},
        )
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        ec_transfer_config=ec_transfer_config,
        ec_manager_config=EncoderCacheManagerConfig(
            encoder_cache_manager_cls=manager_cls, manager_config=manager_config or {}
        ),
    )
    return scheduler_for(vllm_config, setup.num_blocks, _ImageRegistry(setup.max_image_tokens))


def store_for_ec_connector(directory: Path, identifiers: Sequence[str]) -> None:
    """Make vLLM's example EC connector find these items in ``directory``."""
    for identifier in identifiers:
        (directory / identifier).mkdir(parents=True, exist_ok=True)
        (directory / identifier / "encoder_cache.safetensors").touch()


# --- workload ----------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    identifier: str
    length: int
    is_embed: tuple[bool, ...] | None = None  # break tokens between rows, Qwen-VL style


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival_step: int
    prompt: tuple[int | Image, ...]  # text token ids and images, in order
    max_tokens: int
    # An encoder-decoder model's input (audio): encoded before the first
    # decoder token, its placeholder at offset 0, not part of the prompt.
    encoder_input: Image | None = None


def conversations(
    seed: int,
    num_conversations: int,
    num_turns: int,
    num_images: int = 24,
    image_lengths: Sequence[int] = (48, 64, 96, 128),
    arrival_gap: int = 3,
    max_tokens: tuple[int, int] = (2, 10),
    images_per_turn: tuple[int, int] = (1, 1),
) -> list[RequestSpec]:
    """Multi-turn chats over a shared image pool.

    Each turn resends the whole conversation (earlier images included) plus the
    previous answer, new text and sometimes new images (``images_per_turn``,
    as for a photo set or video frames) or a second mention of an image already
    in the prompt; a third of the prompts end with an image. Images are drawn with a skew, so popular
    ones are shared between chats.
    """
    rng = random.Random(seed)
    pool = []
    for n in range(num_images):
        length = rng.choice(image_lengths)
        mask = tuple(i % 9 != 8 for i in range(length)) if n % 3 == 0 else None
        pool.append(Image(f"img{n}", length, mask))
    weights = [1.0 / (n + 1) for n in range(num_images)]
    specs = []
    for c in range(num_conversations):
        prompt: list[int | Image] = []
        start = rng.randrange(0, arrival_gap * num_conversations // 2 + 1)
        for t in range(num_turns):
            prompt += [rng.randrange(1, 1000) for _ in range(rng.randrange(4, 24))]
            if t == 0 or rng.random() < 0.6:
                for k in range(rng.randint(*images_per_turn)):
                    prompt += [rng.randrange(1, 1000)] * (k > 0) + [rng.choices(pool, weights)[0]]
            mentioned = [x for x in prompt if isinstance(x, Image)]
            if mentioned and rng.random() < 0.3:
                prompt += [rng.randrange(1, 1000), rng.choice(mentioned)]
            # Some prompts end right after an image.
            prompt += [rng.randrange(1, 1000) for _ in range(rng.choice((0, 2, 5)))]
            answer = rng.randrange(*max_tokens)
            specs.append(RequestSpec(f"c{c}t{t}", start + t * arrival_gap, tuple(prompt), answer))
            prompt += [SAMPLED_TOKEN] * answer
    specs.sort(key=lambda s: (s.arrival_step, s.request_id))
    return specs


def transcriptions(
    seed: int, num_requests: int, num_clips: int = 6, clip_lengths: Sequence[int] = (300, 750, 1500)
) -> list[RequestSpec]:
    """Encoder-decoder requests: one audio clip each (popular clips sent
    again), a few decoder prompt tokens, answers of 4 to 40 tokens."""
    rng = random.Random(seed)
    clips = [Image(f"clip{n}", rng.choice(clip_lengths)) for n in range(num_clips)]
    return [
        RequestSpec(
            f"t{n}",
            n // 2,
            tuple(50258 + rng.randrange(4) for _ in range(rng.randrange(1, 5))),
            rng.randrange(4, 40),
            encoder_input=rng.choices(clips, [1.0 / (i + 1) for i in range(num_clips)])[0],
        )
        for n in range(num_requests)
    ]


_block_hasher = None


def _feature(item: Image, offset: int) -> MultiModalFeatureSpec:
    mask = None if item.is_embed is None else torch.tensor(item.is_embed)
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem.dummy(),
        modality="image",
        identifier=item.identifier,
        mm_position=PlaceholderRange(offset=offset, length=item.length, is_embed=mask),
    )


def make_request(spec: RequestSpec) -> Request:
    """A fresh vLLM Request for ``spec`` (Requests are mutated by the scheduler)."""
    global _block_hasher
    if _block_hasher is None:
        init_none_hash(sha256)
        _block_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    token_ids: list[int] = []
    features = []
    if spec.encoder_input is not None:
        features.append(_feature(spec.encoder_input, 0))
    for part in spec.prompt:
        if isinstance(part, Image):
            features.append(_feature(part, len(token_ids)))
            token_ids += [IMAGE_TOKEN] * part.length
        else:
            token_ids.append(part)
    return Request(
        request_id=spec.request_id,
        prompt_token_ids=token_ids,
        sampling_params=SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
        pooling_params=None,
        mm_features=features,
        block_hasher=_block_hasher,
    )


# --- driving -----------------------------------------------------------------


@dataclass
class Run:
    steps: list[dict[str, Any]] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)  # schedule() + update_from_output() per step


def fake_model_output(scheduler: Any, scheduler_output: Any) -> ModelRunnerOutput:
    """One sampled token for each request past its prompt, none for prefill chunks."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[
            [] if scheduler.requests[req_id].is_prefill_chunk else [SAMPLED_TOKEN] for req_id in req_ids
        ],
    )


def _record(scheduler_output: Any, engine_outputs: dict[int, Any], manager: Any) -> dict[str, Any]:
    outputs = sorted(
        (o.request_id, list(o.new_token_ids), None if o.finish_reason is None else str(o.finish_reason))
        for client in engine_outputs.values()
        for o in client.outputs
    )
    return {
        "new": [r.req_id for r in scheduler_output.scheduled_new_reqs],
        "running": list(scheduler_output.scheduled_cached_reqs.req_ids),
        "tokens": dict(scheduler_output.num_scheduled_tokens),
        "encoder_inputs": dict(scheduler_output.scheduled_encoder_inputs),
        "encoder_input_updates": {r: sorted(u) for r, u in scheduler_output.encoder_input_updates.items()},
        "freed_hashes": list(scheduler_output.free_encoder_mm_hashes),
        "finished": sorted(scheduler_output.finished_req_ids),
        "preempted": sorted(scheduler_output.preempted_req_ids or ()),
        "outputs": outputs,
        "ec_loads": [(m.mm_hash, m.num_token) for m in getattr(scheduler_output.ec_connector_metadata, "mm_datas", ())],
        "free_slots": manager.num_free_slots,
        "freeable_slots": getattr(manager, "num_freeable_slots", None),  # none for encoder-decoder
        "held_embeds": _held_embeds(manager),
    }


def _held_embeds(manager: Any) -> int | None:
    """Embeddings our encoder-decoder manager holds for requests (None for any other manager)."""
    if hasattr(manager, "num_freeable_slots") or not hasattr(manager, "snapshot"):
        return None
    return sum(size for inputs in manager.snapshot()["held"].values() for _, size in inputs)


def run(
    scheduler: Any,
    specs: Sequence[RequestSpec],
    record: bool = True,
    max_steps: int = 10_000,
    in_flight: int = 1,
    model_seconds: float = 0.0,
) -> Run:
    """Feed ``specs`` at their arrival steps until every request has finished.

    ``in_flight=2`` runs as vLLM's engine does with async scheduling: the next
    step is scheduled before the previous step's output comes back (only for
    ``AsyncScheduler``). A step's record is taken when its output is processed.
    ``model_seconds``: the scheduler's thread sleeps this long after each
    ``schedule()``, untimed, as vLLM's engine waits for the model, so other
    threads run there rather than inside the timed calls.
    """
    requests = [make_request(spec) for spec in specs]
    result = Run()
    arrivals = [spec.arrival_step for spec in specs]
    next_arrival = 0
    batches: deque[tuple[Any, ModelRunnerOutput, int]] = deque()
    for step in range(max_steps):
        while next_arrival < len(requests) and arrivals[next_arrival] <= step:
            scheduler.add_request(requests[next_arrival])
            next_arrival += 1
        if next_arrival == len(requests) and not scheduler.has_unfinished_requests() and not batches:
            return result
        begin = time.perf_counter_ns()
        scheduler_output = scheduler.schedule()
        scheduled_ns = time.perf_counter_ns() - begin
        batches.append((scheduler_output, fake_model_output(scheduler, scheduler_output), scheduled_ns))
        if model_seconds:
            time.sleep(model_seconds)
        # An empty step means everything waits on outputs: take the oldest back.
        while len(batches) >= in_flight or (batches and not scheduler_output.total_num_scheduled_tokens):
            done, model_output, scheduled_ns = batches.popleft()
            begin = time.perf_counter_ns()
            engine_outputs = scheduler.update_from_output(done, model_output)
            result.step_ns.append(scheduled_ns + time.perf_counter_ns() - begin)
            if record:
                result.steps.append(_record(done, engine_outputs, scheduler.encoder_cache_manager))
    raise AssertionError(f"requests still unfinished after {max_steps} steps")
