"""Stock vLLM 0.33 against vLLM with our manager and with our scheduler subclass.

Each scenario drives vLLM's real Scheduler (built on CPU as described in
vllm_harness.py) through the same multimodal workload with fake model
outputs, once per variant, and requires the same record at every step:
scheduled requests and tokens, scheduled encoder inputs, freed encoder-cache
hashes, finished and preempted requests, engine outputs and the cache's slot
counts. Skipped unless vLLM 0.33 is importable (see the README, "Use with vLLM").
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

import vllm_harness as harness  # noqa: E402

import encoder_cache  # noqa: E402
import encoder_cache.vllm as hook  # noqa: E402

pytestmark = pytest.mark.vllm

VARIANTS = list(harness.VARIANTS)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return harness.model_config(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return harness.model_config(tmp_path_factory.mktemp("tiny-whisper"), encoder_decoder=True)


def _first_difference(expected: list[dict], got: list[dict]) -> str:
    for step, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            fields = {k: (a[k], b[k]) for k in a if a[k] != b.get(k)}
            return f"step {step}: (stock, ours) = {fields}"
    return f"step count: stock {len(expected)}, ours {len(got)}"


def _run_all(model, setup, specs, in_flight=1, ignore=()) -> dict[str, list[dict]]:
    """Every variant's steps; all must equal stock's, except in the fields ``ignore``."""
    runs = {
        variant: harness.run(harness.build_scheduler(variant, model, setup), specs, in_flight=in_flight).steps
        for variant in VARIANTS
    }
    compared = {
        variant: [{k: v for k, v in step.items() if k not in ignore} for step in steps]
        for variant, steps in runs.items()
    }
    for variant in VARIANTS[1:]:
        assert compared[variant] == compared["stock"], (
            f"{variant}: {_first_difference(compared['stock'], compared[variant])}"
        )
    return runs


def _total(steps, key):
    return sum(len(step[key]) for step in steps)


SCENARIOS = {
    # Chunked prefill cuts through images; turns resend earlier images; a small cache evicts.
    "multi-turn": (harness.Setup(), dict(seed=1, num_conversations=12, num_turns=4)),
    # vLLM never splits an image across steps.
    "whole-images": (harness.Setup(disable_chunked_mm_input=True), dict(seed=2, num_conversations=12, num_turns=4)),
    # Masks of 96 to 400 entries: 96 read with tolist(), 200 and 400 as their numpy views' bytes.
    "long-masks": (
        harness.Setup(
            max_image_tokens=400, encoder_cache_size=1200, encoder_compute_budget=800, max_num_batched_tokens=512
        ),
        dict(seed=3, num_conversations=10, num_turns=3, image_lengths=(96, 200, 400)),
    ),
    # Long answers in a small KV cache: requests are preempted and their encoder inputs freed.
    "preemption": (
        harness.Setup(num_blocks=80),
        dict(seed=1, num_conversations=12, num_turns=3, max_tokens=(30, 80)),
    ),
}


# How the engine drives the scheduler: (async scheduling, steps in flight).
# With two in flight, as vLLM's engine runs async scheduling, a step is
# scheduled before the previous one's output is back.
DRIVES = {"sync": (False, 1), "async": (True, 1), "async-overlapped": (True, 2)}


@pytest.mark.parametrize("drive", list(DRIVES))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_same_scheduler_output_every_step(model, scenario, drive):
    setup, workload = SCENARIOS[scenario]
    async_scheduling, in_flight = DRIVES[drive]
    setup = harness.Setup(**{**setup.__dict__, "async_scheduling": async_scheduling})
    specs = harness.conversations(**workload)
    steps = _run_all(model, setup, specs, in_flight)["stock"]
    # The workload did exercise what it is meant to.
    occurrences = sum(1 for spec in specs for part in spec.prompt if isinstance(part, harness.Image))
    encoded = sum(len(ids) for step in steps for ids in step["encoder_inputs"].values())
    assert 0 < encoded < occurrences, "cache hits expected"
    assert _total(steps, "freed_hashes") > 0, "evictions expected"
    assert sum(1 for step in steps for output in step["outputs"] if output[2] is not None) == len(specs)
    if scenario == "preemption":
        assert _total(steps, "preempted") > 0


# Clips of up to 1,500 embeddings (Whisper's 30 s); room for two at a time.
WHISPER_SETUP = harness.Setup(
    max_image_tokens=1500, encoder_cache_size=3000, encoder_compute_budget=3000, max_num_batched_tokens=2048
)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_encoder_decoder_same_scheduler_output_every_step(whisper, async_scheduling):
    """The same decisions at every step; only the free-slot count differs, where
    vLLM's is wrong: its scheduler frees an encoder-decoder request's input on
    every decode step and vLLM 0.33's manager adds the input's size back each
    time (vLLM #55733), so its count climbs past the cache size. Ours frees each
    held input once: free slots are always the cache size minus what is held."""
    setup = harness.Setup(**{**WHISPER_SETUP.__dict__, "async_scheduling": async_scheduling})
    specs = harness.transcriptions(seed=3, num_requests=24)
    runs = _run_all(whisper, setup, specs, ignore=("free_slots", "held_embeds"))
    steps = runs["stock"]
    # No cache for encoder-decoder models: every request's clip is encoded, once.
    encoded = [r for step in steps for r, ids in step["encoder_inputs"].items() for _ in ids]
    assert sorted(encoded) == sorted(spec.request_id for spec in specs)
    assert len({spec.encoder_input for spec in specs}) < len(specs), "repeated clips expected"
    cache_size = WHISPER_SETUP.encoder_cache_size
    first_over = next((n for n, step in enumerate(steps) if step["free_slots"] > cache_size), None)
    assert first_over is not None, "vLLM's free-slot count was expected to pass the cache size"
    for variant in VARIANTS[1:]:
        ours = runs[variant]
        assert all(step["free_slots"] == cache_size - step["held_embeds"] for step in ours)
        assert ours[first_over]["free_slots"] <= cache_size < steps[first_over]["free_slots"]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_same_scheduler_output_with_an_ec_connector(model, tmp_path, async_scheduling):
    """vLLM's example EC connector finds some images remotely: those are loaded, not encoded."""
    harness.store_for_ec_connector(tmp_path, ["img0", "img2", "img5"])
    setup = harness.Setup(ec_storage=str(tmp_path), async_scheduling=async_scheduling)
    steps = _run_all(model, setup, harness.conversations(seed=1, num_conversations=12, num_turns=4))["stock"]
    loaded = {mm_hash for step in steps for mm_hash, _ in step["ec_loads"]}
    assert loaded and loaded <= {"img0", "img2", "img5"}
    assert any(step["encoder_inputs"] for step in steps), "local encodes expected too"


def test_embed_count_mismatch_rejects_the_same_request(model):
    """A reused multimodal UUID with another size: vLLM rejects the request; so do we."""
    first = harness.RequestSpec("a", 0, (1, 2, harness.Image("uuid", 64), 3), 4)
    clash = harness.RequestSpec("b", 1, (4, harness.Image("uuid", 96), 5), 4)
    runs = _run_all(model, harness.Setup(), [first, clash])
    finishes = {o[0]: o[2] for step in runs["stock"] for o in step["outputs"] if o[2] is not None}
    assert finishes == {"a": "length", "b": "error"}
    assert "b" not in {r for step in runs["stock"] for r in step["encoder_inputs"]}


def test_the_comparison_notices_a_cache_that_behaves_differently(model):
    specs = harness.conversations(seed=1, num_conversations=12, num_turns=4)
    small = harness.run(harness.build_scheduler("stock", model, harness.Setup()), specs).steps
    large = harness.run(harness.build_scheduler("stock", model, harness.Setup(encoder_cache_size=1024)), specs).steps
    assert small != large


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_vllm_builds_our_classes_from_its_config(model, async_scheduling):
    setup = harness.Setup(async_scheduling=async_scheduling)
    stock = harness.build_scheduler("stock", model, setup)
    with_manager = harness.build_scheduler("manager", model, setup)
    ours = harness.build_scheduler("scheduler", model, setup)
    assert type(with_manager) is type(stock)
    assert type(ours) is (hook.AsyncScheduler if async_scheduling else hook.Scheduler)
    for scheduler in (with_manager, ours):
        assert isinstance(scheduler.encoder_cache_manager, encoder_cache.EncoderCacheManager)
        assert scheduler.encoder_cache_manager.cache_size == stock.encoder_cache_manager.cache_size
        assert scheduler.schedule().ec_manager_metadata is None


@pytest.mark.parametrize("variant", ["manager", "scheduler"])
def test_vllm_builds_the_encoder_decoder_variant_for_an_encoder_decoder_model(whisper, variant):
    scheduler = harness.build_scheduler(variant, whisper, WHISPER_SETUP)
    assert type(scheduler.encoder_cache_manager) is encoder_cache.EncoderDecoderCacheManager


def test_vllm_passes_manager_config_to_our_hook(model):
    with pytest.raises(ValueError, match=r"unknown manager_config key 'capacity'"):
        harness.build_scheduler("manager", model, harness.Setup(), manager_config={"capacity": 1})


MANAGER_FLAG = '{"encoder_cache_manager_cls": "encoder_cache.vllm.EncoderCacheManager"}'
SERVE_FLAGS = {
    "manager": ["--ec-manager-config", MANAGER_FLAG],
    "async scheduler": ["--scheduler-cls", "encoder_cache.vllm.AsyncScheduler"],
    "sync scheduler": ["--no-async-scheduling", "--scheduler-cls", "encoder_cache.vllm.Scheduler"],
}


@pytest.mark.parametrize("flags", list(SERVE_FLAGS))
def test_vllm_serve_flags_from_the_readme_resolve_to_our_classes(model, monkeypatch, flags):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.import_utils import resolve_obj_by_qualname

    # The parser builds default configs, which need a device; this machine has no GPU.
    monkeypatch.setattr(current_platform, "device_type", current_platform.device_type or "cpu")
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", model.model, *SERVE_FLAGS[flags]]))
    manager_cls = engine_args.ec_manager_config.get_encoder_cache_manager_obj()
    scheduler_cls = engine_args.scheduler_cls and resolve_obj_by_qualname(engine_args.scheduler_cls)
    # async_scheduling None: vLLM turns it on where the executor supports it.
    expected = {
        "manager": (hook.EncoderCacheManager, None, None),
        "async scheduler": (None, hook.AsyncScheduler, None),
        "sync scheduler": (None, hook.Scheduler, False),
    }[flags]
    assert (manager_cls, scheduler_cls, engine_args.async_scheduling) == expected


def test_llm_keyword_arguments_from_the_readme_resolve_to_our_classes(model):
    import json

    from vllm.engine.arg_utils import EngineArgs

    # LLM(model=..., **kwargs) hands its keyword arguments to EngineArgs.
    engine_args = EngineArgs(
        model=model.model, ec_manager_config=json.loads(MANAGER_FLAG), scheduler_cls="encoder_cache.vllm.AsyncScheduler"
    )
    assert engine_args.ec_manager_config.get_encoder_cache_manager_obj() is hook.EncoderCacheManager
    assert engine_args.scheduler_cls == "encoder_cache.vllm.AsyncScheduler"
