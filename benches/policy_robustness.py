"""The recommended policy against ``vllm`` on workloads it was not tuned on:
each built-in workload kind with its knobs drawn at random (arrival rate,
system prompt, popularity skew, catalogue sizes, think time, re-attached
images, the mix's weights), at several cache sizes, counting encoded
embeddings.

    python benches/policy_robustness.py --configs 40 --sizes 8192,32768,131072,524288

Config ``i`` is drawn from ``random.Random(i)`` and runs at seed ``i``, so a
run is reproducible and ``--first`` extends one. Runs the built-in scheduler
model (``--engine model``), the Rust manager. Prints every cell where a
policy encodes more than ``--threshold`` above ``vllm``, then per workload
kind the largest excess and the largest saving of each policy.
"""

from __future__ import annotations

import argparse
import random
from multiprocessing import Pool
from typing import Any

from encoder_cache.simulator import SchedulerLimits, Variant, WorkloadConfig, generate, simulate
from encoder_cache.simulator.workloads import DEFAULT_RATES

KINDS = ("popular", "video", "mix", "chat")


def config(index: int, requests: int) -> dict[str, Any]:
    """The knobs of config ``index``: a workload kind and values around the defaults."""
    r = random.Random(index)
    kind = r.choice(KINDS)
    return {
        "kind": kind,
        "requests": requests,
        "seed": index,
        "arrival_rate": DEFAULT_RATES[kind] * r.choice([0.5, 0.75, 1.0, 1.5, 2.0]),
        "system_tokens": r.choice([0, 64, 512, 2048]),
        "zipf": r.choice([0.5, 0.7, 0.9, 1.1, 1.3]),
        "catalogue": r.choice([200, 1000, 5000]),
        "video_catalogue": r.choice([10, 50, 200]),
        "think_steps": r.choice([20.0, 100.0, 200.0, 1000.0]),
        "repeat_prob": r.choice([0.0, 0.3, 0.7]),
        "mix": tuple(r.choice([0.5, 1.0, 2.0]) for _ in range(3)),
    }


def run(job: tuple[int, int, int, str]) -> tuple[int, int, str, int]:
    index, requests, size, policy = job
    workload = generate(WorkloadConfig(**config(index, requests)))
    result = simulate(workload, SchedulerLimits(), Variant(policy, False, "rust"), cache_size=size)
    return index, size, policy, result.counters.encoded_embeds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=int, default=40, help="how many random configs")
    p.add_argument("--first", type=int, default=0, help="index of the first config")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--sizes", default="8192,32768,131072,524288")
    p.add_argument("--policies", default="duel", help="compared with vllm, comma-separated")
    p.add_argument("--threshold", type=float, default=0.005, help="excess over vllm to list (0.005: 0.5%%)")
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    policies = [name for name in a.policies.split(",") if name != "vllm"]
    indices = range(a.first, a.first + a.configs)
    jobs = [(i, a.requests, z, name) for i in indices for z in sizes for name in ["vllm", *policies]]
    with Pool(a.jobs) as pool:
        encoded = {(i, z, name): value for i, z, name, value in pool.imap_unordered(run, jobs)}

    change: dict[tuple[int, int, str], float] = {}
    for i in indices:
        for z in sizes:
            base = encoded[(i, z, "vllm")]
            for name in policies:
                change[(i, z, name)] = encoded[(i, z, name)] / base - 1 if base else 0.0

    print(f"{len(indices)} configs x {len(sizes)} sizes, {a.requests:,} requests each")
    over = [(c, i, z, name) for (i, z, name), c in change.items() if c > a.threshold]
    print(f"cells above vllm by more than {a.threshold:.1%}: {len(over)}")
    for c, i, z, name in sorted(over, reverse=True):
        print(f"  {name} {c:+.2%} at {z:,}: config {i} {config(i, a.requests)}")
    print()
    print("| kind | configs | policy | largest excess over vllm | largest saving | median change |")
    print("|---|---:|---|---:|---:|---:|")
    for kind in KINDS:
        mine = [i for i in indices if config(i, a.requests)["kind"] == kind]
        for name in policies:
            values = sorted(change[(i, z, name)] for i in mine for z in sizes)
            if not values:
                continue
            median = values[len(values) // 2]
            print(f"| {kind} | {len(mine)} | {name} | {max(values):+.2%} | {min(values):+.2%} | {median:+.2%} |")


if __name__ == "__main__":
    main()
