"""What the host-memory tier saves in vLLM 0.33's real scheduler, per policy.

    VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=python:tests python benches/host_tier_policies.py [--seeds 3]

Drives vLLM's real ``Scheduler`` on CPU (tests/host_tier_harness.py: a
weightless LLaVA-shaped model, the worker's copies reported done within the
step) over multi-turn image chats whose images are drawn, with a skew, from a
shared pool (tests/vllm_harness.py's ``conversations``), once without an EC
connector and once with ``encoder_cache.vllm.HostTierConnector`` under each
host policy, at two host-region sizes. Prints the embeddings the GPU encoded,
and each policy's change against no host tier and against ``fifo`` (vLLM's
own ``ECCPUConnector`` decides exactly as ``fifo``). Needs vLLM 0.33.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import host_tier_harness
import vllm_harness as harness

from encoder_cache import HOST_POLICIES

#: A GPU encoder cache of 384 embeddings (three to eight images) and an encoder budget of 256 per step.
SETUP = harness.Setup(encoder_cache_size=384, encoder_compute_budget=256, max_num_seqs=32, num_blocks=4000)
#: Host regions, in rows (one embedding each): about 15 and 60 images of the pool's average size.
REGION_ROWS = (1_280, 5_120)
#: name -> keyword arguments of ``conversations`` (the seed is added).
WORKLOADS = {
    "chat": dict(num_conversations=60, num_turns=5, num_images=120, arrival_gap=4),
    "popular": dict(num_conversations=300, num_turns=1, num_images=200, arrival_gap=1, images_per_turn=(1, 3)),
}


def encoded_embeds(model, specs, connector: str | None, extra: dict) -> int:
    if connector is None:
        steps = harness.run(harness.build_scheduler("stock", model, SETUP), specs).steps
        return sum(
            spec_length
            for step in steps
            for request_id, ids in step["encoder_inputs"].items()
            for spec_length in _lengths(specs, request_id, ids)
        )
    scheduler = host_tier_harness.build(model, SETUP, connector, extra)
    return host_tier_harness.totals(host_tier_harness.drive(scheduler, specs))["encoded_embeds"]


def _lengths(specs, request_id: str, ids: list[int]) -> list[int]:
    spec = next(s for s in specs if s.request_id == request_id)
    images = [part for part in spec.prompt if isinstance(part, harness.Image)]
    return [sum(images[i].is_embed) if images[i].is_embed else images[i].length for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    model = harness.model_config(Path(tempfile.mkdtemp(prefix="host-tier-llava-")))
    print("| workload | seed | host rows | no host tier | " + " | ".join(HOST_POLICIES) + " | best vs fifo |")
    print("| --- | ---: | ---: | ---: |" + " ---: |" * (len(HOST_POLICIES) + 1))
    for name, kwargs in WORKLOADS.items():
        for seed in range(1, args.seeds + 1):
            specs = harness.conversations(seed=seed, **kwargs)
            without = encoded_embeds(model, specs, None, {})
            for rows in REGION_ROWS:
                extra = {"ec_cpu_bytes": rows * host_tier_harness.ROW_BYTES}
                got = {
                    policy: encoded_embeds(model, specs, "HostTierConnector", {**extra, "ec_cpu_policy": policy})
                    for policy in HOST_POLICIES
                }
                cells = [f"{n:,} ({(n - without) / without:+.1%})" for n in got.values()]
                best = min(got.values())
                vs_fifo = f"{(best - got['fifo']) / got['fifo']:+.1%}"
                print(
                    f"| {name} | {seed} | {rows:,} | {without:,} | " + " | ".join(cells) + f" | {vs_fifo} |", flush=True
                )


if __name__ == "__main__":
    main()
