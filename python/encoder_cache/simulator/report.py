"""The simulator's output: text tables, the recommendation, JSON, a plot."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.results import RunResult

__all__ = ["Report", "format_bytes", "plot"]

#: A size "gets within" an unbounded cache when it encodes at most this much more.
WITHIN = 0.05


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _pct(value: float, base: float) -> str:
    if not base:
        return "n/a"
    return f"{(value - base) / base:+.1%}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


@dataclass
class Report:
    """Every run of one invocation, and what the output says about them."""

    description: str
    limits: SchedulerLimits
    cost: EncoderCost
    bytes_per_embed: int
    memory_basis: str
    default_size: int
    #: Runs at the default capacity (the headline), in variant order.
    headline: list[RunResult] = field(default_factory=list)
    #: Sweep runs, any order.
    sweep: list[RunResult] = field(default_factory=list)
    unbounded: RunResult | None = None
    behaviour: bool = False
    #: Which engine ran the workload: the built-in ``model`` or ``vllm``'s own scheduler.
    engine: str = "model"

    # What the runs say

    def baseline(self, runs: list[RunResult]) -> RunResult | None:
        return next((r for r in runs if r.variant.policy == "vllm" and not r.variant.lookahead), None)

    def best(self) -> RunResult | None:
        """The real policy (not the oracle) that encodes least at the default capacity."""
        real = [r for r in self.headline if r.variant.policy != "oracle"]
        return min(real, key=lambda r: (r.counters.encoded_embeds, r.counters.encoder_seconds)) if real else None

    def sizes(self) -> list[int]:
        return sorted({r.encoder_cache_size for r in self.sweep})

    def sweep_variants(self) -> list[str]:
        names: list[str] = []
        for r in self.sweep:
            if r.name not in names:
                names.append(r.name)
        return names

    def sweep_run(self, name: str, size: int) -> RunResult | None:
        return next((r for r in self.sweep if r.name == name and r.encoder_cache_size == size), None)

    def recommendation(self) -> dict[str, Any] | None:
        """The smallest swept size at which some real policy encodes within 5%
        of an unbounded cache (or the largest size, ``found`` false)."""
        if self.unbounded is None or not self.sweep:
            return None
        floor = self.unbounded.counters.encoded_embeds
        sizes = self.sizes()
        for index, size in enumerate(sizes):
            runs = [r for r in self.sweep if r.encoder_cache_size == size and r.variant.policy != "oracle"]
            if not runs:
                continue
            best = min(runs, key=lambda r: r.counters.encoded_embeds)
            if best.counters.encoded_embeds <= floor * (1 + WITHIN) or index == len(sizes) - 1:
                within = [r.name for r in runs if r.counters.encoded_embeds <= floor * (1 + WITHIN)]
                return {
                    "found": bool(within),
                    "size": size,
                    "variant": best.name,
                    "encoded_embeds": best.counters.encoded_embeds,
                    "variants_within": within,
                }
        return None

    def recommendation_sentence(self) -> str | None:
        rec = self.recommendation()
        if rec is None:
            return None
        floor = self.unbounded.counters.encoded_embeds if self.unbounded else 0
        size, name = rec["size"], rec["variant"]
        memory = format_bytes(size * self.bytes_per_embed)
        extra = _pct(rec["encoded_embeds"], floor)
        if not rec["found"]:
            return (
                f"Recommendation: no size tried comes within {WITHIN:.0%} of an unbounded cache; the largest, "
                f"{size:,} embeddings ({memory}) with policy {name}, still encodes {extra} more: try larger sizes."
            )
        if "vllm" in rec["variants_within"]:
            policy = "any policy (vLLM's own included)"
        else:
            policy = f"policy {name}"
        sentence = (
            f"Recommendation: an encoder cache of {size:,} embeddings ({memory}) with {policy} "
            f"encodes within {WITHIN:.0%} of an unbounded cache ({extra})"
        )
        base = self.baseline(self.headline)
        if base is not None and size != self.default_size:
            sentence += (
                f"; vLLM's default ({self.default_size:,} embeddings, "
                f"{format_bytes(self.default_size * self.bytes_per_embed)}) encodes "
                f"{_pct(base.counters.encoded_embeds, floor)} more than unbounded"
            )
            best = self.best()
            if best is not None and best.counters.encoded_embeds < base.counters.encoded_embeds * (1 - 0.01):
                sentence += (
                    f"; at that default size, policy {best.name} encodes "
                    f"{_pct(best.counters.encoded_embeds, base.counters.encoded_embeds)} against vllm"
                )
        return sentence + "."

    # Text

    def header(self) -> str:
        limits = self.limits
        prefix = "on" if limits.prefix_caching else "off"
        engine = "vLLM 0.33's scheduler" if self.engine == "vllm" else "the scheduler model"
        return (
            f"{self.description} | {engine}, {'async' if limits.async_scheduling else 'sync'} scheduling, "
            f"admission {'whole prompt' if limits.reserve_full_isl else 'first chunk'} | "
            f"max_num_batched_tokens {limits.max_num_batched_tokens}, "
            f"max_num_seqs {limits.max_num_seqs}, KV cache {limits.kv_capacity:,} tokens, prefix caching {prefix} | "
            f"encoder cost {self.cost.per_embed_us:g} us/embed + {self.cost.per_embed_sq_us:g} us/embed^2 | "
            f"{self.bytes_per_embed:,} bytes per embedding ({self.memory_basis})"
        )

    def headline_table(self) -> list[str]:
        runs = self.headline
        base = self.baseline(runs) or runs[0]
        rows = []
        for r in runs:
            c = r.counters
            rows.append(
                [
                    r.name,
                    f"{c.encoded_embeds:,}",
                    _pct(c.encoded_embeds, base.counters.encoded_embeds),
                    f"{c.recomputed_embeds:,}",
                    f"{c.hit_rate:.1%}",
                    f"{c.encoder_seconds:,.1f}",
                    _pct(c.encoder_seconds, base.counters.encoder_seconds),
                    f"{c.prefix_hit_rate:.1%}",
                    f"{r.bookkeeping_us_per_step:.1f}",
                ]
            )
        header = [
            "policy",
            "encoded embeds",
            f"vs {base.name}",
            "re-encoded",
            "hit rate",
            "encoder GPU s",
            f"vs {base.name}",
            "prefix hits",
            "bookkeeping us/step",
        ]
        if self.behaviour:
            header[0] = "behaviour"
            header.insert(4, "evicted in use")
            for row, r in zip(rows, runs):
                row.insert(4, f"{r.counters.evicted_in_use_embeds:,}")
        size = runs[0].encoder_cache_size
        c = base.counters
        lines = [
            f"At vLLM's default capacity: encoder cache {size:,} embeddings "
            f"({format_bytes(size * self.bytes_per_embed)}), encoder budget {runs[0].encoder_compute_budget:,} per step; "
            f"{c.requests:,} requests in {c.steps:,} steps, {c.waiting_steps / max(c.steps, 1):.0%} of them with "
            f"a waiting queue, {c.preemptions:,} preemptions",
            "",
            *_table(header, rows),
        ]
        oracle = next((r for r in runs if r.variant.policy == "oracle"), None)
        best = self.best()
        if best is not None and best.name != base.name:
            saved = base.counters.encoded_embeds - best.counters.encoded_embeds
            lines += [
                "",
                f"Best policy here: {best.name}, {saved:,} fewer embeddings encoded than {base.name} "
                f"({_pct(best.counters.encoded_embeds, base.counters.encoded_embeds)}), encoder time "
                f"{_pct(best.counters.encoder_seconds, base.counters.encoder_seconds)}.",
            ]
            if oracle is not None:
                lines.append(
                    f"The oracle (Belady, offline) encodes {_pct(oracle.counters.encoded_embeds, base.counters.encoded_embeds)}"
                    f" against {base.name}: the most any eviction order could save at this size."
                )
        if self.unbounded is not None:
            u = self.unbounded.counters
            lines.append(
                f"An unbounded cache would encode {u.encoded_embeds:,} embeddings "
                f"({_pct(u.encoded_embeds, base.counters.encoded_embeds)}): "
                f"{base.counters.recomputed_embeds / max(base.counters.encoded_embeds, 1):.0%} of {base.name}'s "
                "encoded embeddings re-encode items it evicted."
            )
        return lines

    def sweep_table(self) -> list[str]:
        names = self.sweep_variants()
        header = ["cache size", "memory", *names]
        if self.unbounded is not None:
            header.append("vs unbounded")
        rows = []
        floor = self.unbounded.counters.encoded_embeds if self.unbounded else 0
        for size in self.sizes():
            row = [f"{size:,}", format_bytes(size * self.bytes_per_embed)]
            best = None
            for name in names:
                run = self.sweep_run(name, size)
                if run is None:
                    row.append("-")
                    continue
                c = run.counters
                miss = c.encoded_embeds / max(c.encoded_embeds + c.hit_embeds, 1)
                row.append(f"{c.encoded_embeds:,} ({miss:.0%} miss)")
                if run.variant.policy != "oracle" and (best is None or c.encoded_embeds < best):
                    best = c.encoded_embeds
            if self.unbounded is not None:
                row.append(_pct(best, floor) if best is not None else "-")
            rows.append(row)
        if self.unbounded is not None:
            u = self.unbounded.counters.encoded_embeds
            rows.append(["unbounded", "-", *[f"{u:,}" for _ in names], "+0.0%"])
        return [
            "Encoded embeddings by encoder-cache size (miss = encoded / looked up, in embeddings):",
            "",
            *_table(header, rows),
        ]

    def text(self) -> str:
        lines = [self.header(), ""]
        if self.headline:
            lines += self.headline_table()
        if self.sweep:
            if self.headline:
                lines.append("")
            lines += self.sweep_table()
        sentence = self.recommendation_sentence()
        if sentence:
            lines += ["", sentence]
        return "\n".join(lines)

    # JSON

    def to_json(self, config: Any) -> dict[str, Any]:
        def run(r: RunResult) -> dict[str, Any]:
            return {
                "name": r.name,
                "variant": asdict(r.variant),
                "encoder_cache_size": r.encoder_cache_size,
                "encoder_cache_bytes": r.encoder_cache_size * self.bytes_per_embed,
                "encoder_compute_budget": r.encoder_compute_budget,
                "counters": r.counters.as_dict(),
                "manager_stats": r.manager_stats,
                "timings": {
                    "bookkeeping_seconds": r.bookkeeping_seconds,
                    "bookkeeping_us_per_step": r.bookkeeping_us_per_step,
                    "wall_seconds": r.wall_seconds,
                },
            }

        best = self.best()
        return {
            "workload": config,
            "engine": self.engine,
            "limits": asdict(self.limits),
            "cost": asdict(self.cost),
            "bytes_per_embed": self.bytes_per_embed,
            "default_cache_size": self.default_size,
            "headline": [run(r) for r in self.headline],
            "best_policy": best.name if best is not None else None,
            "sweep": [run(r) for r in sorted(self.sweep, key=lambda r: (r.encoder_cache_size, r.name))],
            "unbounded": run(self.unbounded) if self.unbounded is not None else None,
            "recommendation": self.recommendation(),
            "recommendation_text": self.recommendation_sentence(),
        }


def plot(report: Report, path: str) -> None:
    """Encoded embeddings against encoder-cache size, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(8, 5), constrained_layout=True)
    sizes = report.sizes() or [report.default_size]
    styles = ["-", "--", "-.", ":"]
    for index, name in enumerate(report.sweep_variants()):
        points = [(s, report.sweep_run(name, s)) for s in sizes]
        xs = [s for s, r in points if r is not None]
        ys = [r.counters.encoded_embeds / 1e6 for _, r in points if r is not None]
        axes.plot(xs, ys, marker="o", linestyle=styles[index % len(styles)], label=name)
    if not report.sweep:
        for r in report.headline:
            axes.plot([r.encoder_cache_size], [r.counters.encoded_embeds / 1e6], marker="o", label=r.name)
    if report.unbounded is not None:
        axes.axhline(report.unbounded.counters.encoded_embeds / 1e6, color="0.4", linewidth=1, label="unbounded cache")
    top = axes.get_ylim()[1]
    axes.axvline(report.default_size, color="0.6", linestyle=":", linewidth=1)
    axes.annotate(" vLLM default", (report.default_size, top), fontsize=8, ha="left", va="top")
    rec = report.recommendation()
    if rec is not None and rec["found"]:
        axes.axvline(rec["size"], color="C2", linestyle=":", linewidth=1)
        axes.annotate("recommended ", (rec["size"], top * 0.94), fontsize=8, ha="right", va="top", color="C2")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes)
    axes.set_xticklabels([f"{s:,}\n{format_bytes(s * report.bytes_per_embed)}" for s in sizes], fontsize=8)
    axes.set_xlabel(f"encoder cache size, embeddings (memory at {report.bytes_per_embed:,} bytes each)")
    axes.set_ylabel("embeddings encoded (millions)")
    axes.set_ylim(bottom=0)
    axes.set_title(report.description, fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(True, alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
