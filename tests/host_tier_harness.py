"""vLLM 0.33's real Scheduler on CPU with an ``ECCPUConnector`` in
``ec_both`` role: vLLM's own, or ``encoder_cache.vllm.HostTierConnector``.
Shared by tests/test_host_tier_vllm.py and benches/host_tier_policies.py;
importing it imports vLLM.

The scheduler is built as tests/vllm_harness.py builds it (a weightless
LLaVA-shaped model, no GPU), plus the connector's configuration. There is no
worker: :func:`drive` reports, in each step's model output, every save and
load the step's connector metadata asked for as done (a worker whose copies
land within the step). vLLM's connector needs ``VLLM_USE_V2_MODEL_RUNNER=1``
in the environment when the scheduler is built.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import vllm_harness as harness
from vllm.config import CacheConfig, DeviceConfig, ECTransferConfig, SchedulerConfig, VllmConfig
from vllm.distributed.ec_transfer.ec_connector.cpu.common import ECCPUWorkerMetadata
from vllm.v1.outputs import ECConnectorOutput

HIDDEN = harness._LLAVA_CONFIG["text_config"]["hidden_size"]
ROW_BYTES = HIDDEN * 2  # float16: one block per embedding row


def build(model, setup, connector: str, extra: dict, variant: str = "stock") -> Any:
    """vLLM's Scheduler with the CPU connector ``connector`` (vLLM's name, or
    ours), and our manager or scheduler subclass as ``variant`` says
    (``harness.VARIANTS``)."""
    manager_cls, scheduler_cls = harness.VARIANTS[variant]
    scheduler_config = SchedulerConfig(
        scheduler_cls=scheduler_cls[setup.async_scheduling],
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=setup.async_scheduling,
        is_multimodal_model=True,
        is_encoder_decoder=False,
    )
    scheduler_config.encoder_cache_size = setup.encoder_cache_size
    scheduler_config.max_num_encoder_input_tokens = setup.encoder_compute_budget
    ec = ECTransferConfig(
        ec_connector=connector,
        ec_connector_module_path=None if connector == "ECCPUConnector" else "encoder_cache.vllm",
        ec_role="ec_both",
        ec_connector_extra_config=extra,
    )
    # An engine measures this at startup by encoding a dummy image.
    ec.mm_encoder_output_widths = {"image": HIDDEN}
    cache_config = CacheConfig(block_size=harness.BLOCK_SIZE, enable_prefix_caching=True)
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        ec_transfer_config=ec,
        ec_manager_config=harness.EncoderCacheManagerConfig(encoder_cache_manager_cls=manager_cls),
    )
    return harness.scheduler_for(vllm_config, setup.num_blocks, harness._ImageRegistry(setup.max_image_tokens))


def drive(scheduler, specs, max_steps: int = 20_000, in_flight: int = 1) -> list[dict]:
    """Run ``specs`` to the end, the worker reporting every save and load of a
    step as done in that step's output (a worker whose copies land within the
    step); one record per step, taken when it is scheduled. ``in_flight=2``
    runs as vLLM's engine does with async scheduling: the next step is
    scheduled before the previous step's output comes back."""
    requests = [harness.make_request(spec) for spec in specs]
    records = []
    batches: deque[tuple[Any, Any]] = deque()
    pending = 0
    try:
        for step in range(max_steps):
            while pending < len(requests) and specs[pending].arrival_step <= step:
                scheduler.add_request(requests[pending])
                pending += 1
            if pending == len(requests) and not scheduler.has_unfinished_requests() and not batches:
                return records
            out = scheduler.schedule()
            records.append(_record(scheduler, out))
            batches.append((out, _model_output(scheduler, out)))
            # An empty step means everything waits on outputs: take the oldest back.
            while len(batches) >= in_flight or (batches and not out.total_num_scheduled_tokens):
                scheduler.update_from_output(*batches.popleft())
        raise AssertionError(f"unfinished after {max_steps} steps")
    finally:
        scheduler.shutdown()


def _model_output(scheduler: Any, out: Any) -> Any:
    """The fake model output, with the worker's report of the step's saves and loads."""
    meta = out.ec_connector_metadata
    model_output = harness.fake_model_output(scheduler, out)
    model_output.ec_connector_output = ECConnectorOutput(
        ec_connector_worker_meta=ECCPUWorkerMetadata(
            completed_saves=list(meta.saves), completed_loads=[t for t, _, _ in meta.loads.values()]
        )
    )
    return model_output


def _record(scheduler: Any, out: Any) -> dict[str, Any]:
    meta = out.ec_connector_metadata
    return {
        "tokens": dict(out.num_scheduled_tokens),
        "encoded": {r: list(ids) for r, ids in out.scheduled_encoder_inputs.items()},
        "encoded_embeds": sum(
            scheduler.requests[r].mm_features[i].mm_position.get_num_embeds()
            for r, ids in out.scheduled_encoder_inputs.items()
            for i in ids
        ),
        "freed": list(out.free_encoder_mm_hashes),
        "saves": dict(meta.saves),
        "loads": {h: (blocks, shape) for h, (_, blocks, shape) in meta.loads.items()},
    }


def totals(records: list[dict]) -> dict[str, int]:
    """Items encoded on the GPU, loaded from the host tier and saved to it, and
    the embeddings encoded, over a run."""
    return {
        "encoded": sum(len(ids) for step in records for ids in step["encoded"].values()),
        "loaded": sum(len(step["loads"]) for step in records),
        "saved": sum(len(step["saves"]) for step in records),
        "encoded_embeds": sum(step["encoded_embeds"] for step in records),
    }
