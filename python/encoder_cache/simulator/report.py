"""The simulator's output: a text table, JSON for scripts, a PNG plot."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from encoder_cache.simulator.scheduler import RunResult, SchedulerLimits
from encoder_cache.simulator.workloads import WorkloadConfig

__all__ = ["format_table", "plot", "to_json"]

_COLUMNS = (
    ("variant", lambda r: r.name),
    ("requests", lambda r: f"{r.counters.requests:,}"),
    ("steps", lambda r: f"{r.counters.steps:,}"),
    ("preempted", lambda r: f"{r.counters.preemptions:,}"),
    ("encoded embeds", lambda r: f"{r.counters.encoded_embeds:,}"),
    ("recomputed", lambda r: f"{r.counters.recomputed_embeds:,}"),
    ("evicted in use", lambda r: f"{r.counters.evicted_in_use_embeds:,}"),
    ("hit rate", lambda r: f"{r.counters.hit_rate:.1%}"),
    ("evictions", lambda r: f"{r.counters.evictions:,}"),
    ("bookkeeping us/step", lambda r: f"{r.bookkeeping_us_per_step:.1f}"),
)


def _find(results: list[RunResult], implementation: str, behaviour: str) -> RunResult | None:
    return next((r for r in results if (r.implementation, r.behaviour) == (implementation, behaviour)), None)


def _header(config: WorkloadConfig, limits: SchedulerLimits, result: RunResult) -> str:
    return (
        f"workload {config.kind}: {config.requests:,} requests, seed {config.seed}, "
        f"{config.arrival_rate:g} sessions/step | max_num_batched_tokens {limits.max_num_batched_tokens}, "
        f"max_num_seqs {limits.max_num_seqs}, encoder budget {result.encoder_compute_budget}, "
        f"encoder cache {result.encoder_cache_size} embeddings, KV cache {limits.kv_capacity} tokens"
    )


def _findings(results: list[RunResult]) -> list[str]:
    """One line per comparison the results allow."""
    lines = []
    fixed = _find(results, "python", "fixed")
    for behaviour in ("prefix", "scan"):
        other = _find(results, "python", behaviour)
        if fixed is None or other is None:
            continue
        extra = other.counters.encoded_embeds - fixed.counters.encoded_embeds
        share = extra / fixed.counters.encoded_embeds if fixed.counters.encoded_embeds else 0.0
        lines.append(
            f"{other.name} vs {fixed.name}: {extra:+,} embeddings encoded ({share:+.2%}); "
            f"{other.counters.evicted_in_use_embeds:,} re-encoded for items evicted while still in use"
        )
    rust = _find(results, "rust", "fixed")
    if rust is not None and fixed is not None:
        same = "identical" if rust.counters == fixed.counters else "DIFFERENT (a bug: they must agree)"
        lines.append(
            f"bookkeeping, fixed behaviour: rust {rust.bookkeeping_us_per_step:.1f} us/step vs python "
            f"{fixed.bookkeeping_us_per_step:.1f} us/step, "
            f"rust {fixed.bookkeeping_seconds / max(rust.bookkeeping_seconds, 1e-12):.1f}x faster; counters {same}"
        )
    return lines


def format_table(config: WorkloadConfig, limits: SchedulerLimits, results: list[RunResult]) -> str:
    """The results as an aligned text table, with a header line and the findings below."""
    rows = [[name for name, _ in _COLUMNS]] + [[cell(r) for _, cell in _COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    table = [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(row) for row in rows[1:]]
    return "\n".join([_header(config, limits, results[0]), "", *table, "", *_findings(results)])


def to_json(config: WorkloadConfig, limits: SchedulerLimits, results: list[RunResult]) -> dict[str, Any]:
    """Deterministic ``counters`` apart from the machine-dependent ``timings``."""
    return {
        "workload": asdict(config),
        "limits": asdict(limits),
        "encoder_compute_budget": results[0].encoder_compute_budget,
        "encoder_cache_size": results[0].encoder_cache_size,
        "variants": [
            {
                "name": r.name,
                "implementation": r.implementation,
                "behaviour": r.behaviour,
                "counters": {**asdict(r.counters), "hit_rate": r.counters.hit_rate},
                "timings": {
                    "bookkeeping_seconds": r.bookkeeping_seconds,
                    "bookkeeping_us_per_step": r.bookkeeping_us_per_step,
                    "wall_seconds": r.wall_seconds,
                },
            }
            for r in results
        ],
    }


def plot(config: WorkloadConfig, limits: SchedulerLimits, results: list[RunResult], path: str) -> None:
    """Write a PNG comparing the variants: encoder work, work lost to evictions
    of items in use over the run, bookkeeping time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in results]
    colors = [f"C{i}" for i in range(len(results))]
    fig, (work, lost, cost) = plt.subplots(1, 3, figsize=(15, 4.8), constrained_layout=True)
    fig.suptitle(_header(config, limits, results[0]), fontsize=8)

    first = [(r.counters.encoded_embeds - r.counters.recomputed_embeds) / 1e6 for r in results]
    again = [r.counters.recomputed_embeds / 1e6 for r in results]
    work.bar(names, first, color="0.75", label="first encoding")
    work.bar(names, again, bottom=first, color=colors, label="recomputed (colour)")
    for x, (a, b) in enumerate(zip(first, again)):
        work.text(x, a + b, f"{a + b:.3f}M", ha="center", va="bottom", fontsize=8)
    work.set_title("encoder embeddings computed")
    work.set_ylabel("millions of embeddings")
    work.legend(loc="lower right", fontsize=8)

    for r, color, style in zip(results, colors, ("-", "--", "-.", ":")):
        lost.plot(r.evicted_in_use_by_step, color=color, linestyle=style, label=r.name)
    lost.set_title("re-encoded: evicted while still in use")
    lost.set_xlabel("scheduler step")
    lost.set_ylabel("embeddings (cumulative)")
    lost.legend(fontsize=8)

    per_step = [r.bookkeeping_us_per_step for r in results]
    cost.bar(names, per_step, color=colors)
    for x, value in enumerate(per_step):
        cost.text(x, value, f"{value:.1f}", ha="center", va="bottom", fontsize=8)
    cost.set_title("encoder-cache bookkeeping per step")
    cost.set_ylabel("microseconds inside manager calls, per step")

    for axes in (work, cost):
        axes.tick_params(axis="x", labelsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
