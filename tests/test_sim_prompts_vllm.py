"""The simulator's block identity against vLLM 0.33's own block hasher.

Requests of the built-in workloads (content-described: a shared system
prompt, wrapped items, chat turns re-sending their history) are materialized
to token ids and given to vLLM's ``Request`` with its real
``get_request_block_hasher``; the prompt and then every decoded token go in as
vLLM's scheduler adds them. Two blocks must share vLLM's hash exactly when
they share the simulator's key. Skipped unless vLLM 0.33 is importable.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"needs vLLM 0.33.x, found {vllm.__version__}", allow_module_level=True)

from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher  # noqa: E402
from encoder_cache.simulator.prompts import Prompts, materialize  # noqa: E402
from encoder_cache.simulator.workloads import WorkloadConfig, generate  # noqa: E402

pytestmark = pytest.mark.vllm


def _vllm_request(request, hasher) -> Request:
    features = [
        MultiModalFeatureSpec(
            data=MultiModalKwargsItem.dummy(),
            modality=item.modality,
            identifier=item.identifier,
            mm_position=PlaceholderRange(offset=item.offset, length=item.length, is_embed=None),
        )
        for item in request.items
    ]
    vllm_request = Request(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        sampling_params=SamplingParams(max_tokens=len(request.output_token_ids), ignore_eos=True),
        pooling_params=None,
        mm_features=features,
        block_hasher=hasher,
    )
    for token in request.output_token_ids:  # as the scheduler appends each decoded token
        vllm_request.append_output_token_ids(token)
    return vllm_request


@pytest.mark.parametrize("kind", ["chat", "video", "popular", "mix"])
def test_block_keys_match_vllms_block_hasher(kind):
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    config = WorkloadConfig(kind=kind, requests=40, frames=(4, 12), frame_embeds=(20, 70), seed=3)
    prompts = Prompts()
    ours, theirs = [], []
    for spec in generate(config).requests():
        runs = prompts.runs(spec)
        request = materialize(spec, runs)
        blocks = spec.total_tokens // BLOCK_SIZE
        vllm_hashes = _vllm_request(request, hasher).block_hashes
        assert len(vllm_hashes) == blocks
        ours += BlockHasher(runs, spec.items, BLOCK_SIZE).upto(blocks)
        theirs += vllm_hashes
    assert len(ours) == len(theirs)
    # Equal keys exactly when equal hashes: the pairing is one-to-one.
    pairs = set(zip(ours, theirs))
    assert len(pairs) == len(set(ours)) == len(set(theirs))
    assert len(ours) - len(set(ours)) > 10, "the requests share blocks (the system prompt at least)"
