"""Runs the policy grid behind docs/policies.md's tables: each workload, seed
and cache size through ``simulate --json`` (either engine), then one table per
(workload, size): each variant's encoded embeddings against ``vllm``'s, and
the share of the oracle's (Belady) saving it captures.

    python benches/policy_grid.py --engine model --requests 2000 --seeds 1,2,3 --out grid.json
    PYTHONPATH=$PWD/python /work/vllm-venv/bin/python benches/policy_grid.py --engine vllm ...

With ``--engine vllm`` the oracle still runs in the built-in model (vLLM's
scheduler has no oracle), on the same workload: its saving is taken against
the model's own ``vllm`` run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

JOBS = "1"


def run(engine: str, workload: str, requests: int, seed: int, sizes: str, policies: str, lookahead: str) -> list[dict]:
    cmd = [sys.executable, "-m", "encoder_cache", "simulate", "--engine", engine, "--workload", workload]
    cmd += ["--requests", str(requests), "--seed", str(seed), "--cache-sizes", sizes, "--policy", policies]
    cmd += ["--json", "--no-progress", "--jobs", JOBS]
    if lookahead != "both":
        cmd.append("--lookahead" if lookahead == "only" else "--no-lookahead")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    rows = []
    for r in data["sweep"]:
        rows.append(
            {
                "engine": engine,
                "workload": workload,
                "seed": seed,
                "size": r["encoder_cache_size"],
                "variant": r["name"],
                "encoded": r["counters"]["encoded_embeds"],
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", default="model")
    p.add_argument("--workloads", default="popular,video,mix,chat")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--sizes", default="8192,32768")
    p.add_argument("--policies", default="vllm,gdsf,s3fifo,lfu-ghost")
    p.add_argument(
        "--lookahead", choices=("both", "only", "none"), default="both", help="lookahead variants: both, only, none"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", default="1")
    a = p.parse_args()
    global JOBS
    JOBS = a.jobs
    rows = json.loads(a.out.read_text()) if a.out.exists() else []
    done = {(r["engine"], r["workload"], r["seed"]) for r in rows}
    for workload in a.workloads.split(","):
        for seed in map(int, a.seeds.split(",")):
            if (a.engine, workload, seed) in done:
                continue
            policies = a.policies if a.engine == "vllm" else a.policies + ",oracle"
            rows += run(a.engine, workload, a.requests, seed, a.sizes, policies, a.lookahead)
            a.out.write_text(json.dumps(rows))
            print(f"{a.engine} {workload} seed {seed} done", flush=True)


if __name__ == "__main__":
    main()
