"""How much of the oracle's saving a policy can capture on ``popular`` and
``video`` traffic when it knows each item's true popularity, beside the
built-in policies.

``popular`` draws every image independently from a fixed Zipf catalogue, and
``video`` every video (its frames are the items), so the best a policy
without knowledge of the future can do is keep the items most likely to be
asked for: the known-popularity reference below evicts the evictable entry of
lowest true popularity (ties: released earlier first), which frequency
counting (``lfu-ghost``) can only estimate. The oracle (Belady: next use
farthest ahead) knows the future itself.

    python benches/popularity_ceiling.py --workload popular --seeds 1,2 --sizes 8192,32768

Runs the built-in scheduler model (``--engine model``; on these workloads it
encodes exactly what vLLM's real scheduler does, see docs/policies.md) and
prints encoded embeddings against ``vllm`` and each variant's share of the
oracle's saving.
"""

from __future__ import annotations

import argparse
from multiprocessing import Pool

from encoder_cache.reference import EncoderCacheManager
from encoder_cache.reference.policies import GdsfPolicy
from encoder_cache.simulator import SchedulerLimits, Variant, WorkloadConfig, generate, simulate
from encoder_cache.simulator import variants as variants_module
from encoder_cache.simulator.workloads import _Generator


class KnownPopularity(GdsfPolicy):
    """Evicts the entry of lowest true popularity first (a static order, no aging)."""

    name = "known-popularity"

    def __init__(self, weights: dict[str, float]) -> None:
        super().__init__()
        self.weights = weights

    def released(self, identifier: str, tier: int) -> None:
        self.release_at(identifier, tier, self.weights.get(identifier, 0.0))

    def evicted(self, identifier: str) -> None:
        super().evicted(identifier)
        self.clock = 0.0


def weights_of(config: WorkloadConfig) -> dict[str, float]:
    """Each item's probability of being drawn, by identifier: a catalogue
    image's own, or a frame's video's (a video has at most ``frames[1]`` frames)."""
    generator = _Generator(config)
    if config.kind == "popular":
        return {f"popular{rank}": float(p) for rank, p in enumerate(generator.popularity)}
    frames = range(config.frames[1])
    return {f"video{v}-frame{f}": float(p) for v, p in enumerate(generator.video_popularity) for f in frames}


def run(job: tuple[str, int, int, str, int]) -> tuple[int, int, str, int]:
    kind, seed, size, name, requests = job
    config = WorkloadConfig(kind=kind, requests=requests, seed=seed)
    workload = generate(config)
    if name == "known-popularity":
        weights = weights_of(config)
        variants_module.MANAGERS[("python", name)] = lambda n: EncoderCacheManager(n, policy=KnownPopularity(weights))
        result = simulate(
            workload, SchedulerLimits(), Variant("vllm", False, "python", name, label=name), cache_size=size
        )
    else:
        policy, lookahead = name.removesuffix("+lookahead"), name.endswith("+lookahead")
        implementation = "python" if policy == "oracle" else "rust"
        result = simulate(workload, SchedulerLimits(), Variant(policy, lookahead, implementation), cache_size=size)
    return seed, size, name, result.counters.encoded_embeds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("popular", "video"), default="popular")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--sizes", default="8192,32768")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    sizes = [int(s) for s in a.sizes.split(",")]
    names = ["vllm", "arc", "lfu-ghost", "lfu-ghost+lookahead", "known-popularity", "oracle"]
    jobs = [(a.workload, seed, size, name, a.requests) for size in sizes for seed in seeds for name in names]
    with Pool(a.jobs) as pool:
        results = pool.map(run, jobs)
    encoded = {(seed, size, name): value for seed, size, name, value in results}
    print("| size | variant | encoded (sum of seeds) | against vllm | share of the oracle's saving |")
    print("|---:|---|---:|---:|---:|")
    for size in sizes:
        base = sum(encoded[(s, size, "vllm")] for s in seeds)
        best = sum(encoded[(s, size, "oracle")] for s in seeds)
        for name in names:
            total = sum(encoded[(s, size, name)] for s in seeds)
            share = (base - total) / (base - best) if base != best else float("nan")
            print(f"| {size:,} | {name} | {total:,} | {total / base - 1:+.1%} | {share:.0%} |")


if __name__ == "__main__":
    main()
