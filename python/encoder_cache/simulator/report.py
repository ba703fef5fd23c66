"""The simulator's output: text tables, the recommendation, JSON.

The recommendation comes from its own search (``Report.search``: vLLM's
default size, then the sweep ``sweep.fill`` runs for ``vllm`` and the best
policy), never from the sizes a user asked to see, so it does not change with
``--cache-sizes``. It ends with the ``manager_config`` to paste.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.results import RunResult
from encoder_cache.simulator.variants import Variant

__all__ = ["SCHEDULER_CLS", "WITHIN", "Report", "format_bytes", "manager_config"]

#: A size "gets within" an unbounded cache when it encodes at most this much more.
WITHIN = 0.05
#: What vLLM needs for lookahead (the waiting marks come from this scheduler).
SCHEDULER_CLS = (
    "--scheduler-cls encoder_cache.vllm.AsyncScheduler (encoder_cache.vllm.Scheduler with --no-async-scheduling)"
)


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


def manager_config(variant: Variant, cache_size: int) -> dict[str, Any]:
    """The ``manager_config`` of ``encoder_cache.vllm.EncoderCacheManager`` for this variant and size."""
    config: dict[str, Any] = {"cache_size": cache_size}
    if variant.policy != "vllm":
        config["policy"] = variant.policy
    if variant.lookahead:
        config["lookahead"] = True
    return config


def _needs(variant: Variant) -> str:
    return " (lookahead: needs vLLM's --scheduler-cls encoder_cache.vllm.AsyncScheduler)" if variant.lookahead else ""


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
    #: Runs of the size table, any order.
    sweep: list[RunResult] = field(default_factory=list)
    #: Runs the recommendation searches (sizes for vllm and the best policy); the default size comes from the headline.
    search: list[RunResult] = field(default_factory=list)
    unbounded: RunResult | None = None
    #: ``vllm`` at the default size with prefix caching off: what the prefix cache saves.
    no_prefix: RunResult | None = None
    behaviour: bool = False
    #: Lines printed after the header (what was left out, and why).
    notes: list[str] = field(default_factory=list)
    #: The host-tier runs (a ``host_search.HostSection``), when a host tier was asked for.
    host: Any = None
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

    def candidates(self) -> list[RunResult]:
        """The runs the recommendation chooses from: the search's, and its variants at the default size."""
        variants = {r.variant for r in self.search}
        return [r for r in self.headline if r.variant in variants] + self.search

    def recommendation(self) -> dict[str, Any] | None:
        """The smallest searched size at which some real policy encodes within
        5% of an unbounded cache (or the largest size, ``found`` false)."""
        if self.unbounded is None or not self.search:
            return None
        floor = self.unbounded.counters.encoded_embeds
        runs = [r for r in self.candidates() if r.variant.policy != "oracle"]
        sizes = sorted({r.encoder_cache_size for r in runs})
        for index, size in enumerate(sizes):
            here = [r for r in runs if r.encoder_cache_size == size]
            best = min(here, key=lambda r: (r.counters.encoded_embeds, r.counters.encoder_seconds))
            if best.counters.encoded_embeds <= floor * (1 + WITHIN) or index == len(sizes) - 1:
                within = [r.name for r in here if r.counters.encoded_embeds <= floor * (1 + WITHIN)]
                variant = best.variant
                if "vllm" in within:  # vLLM's own order is enough: no reason to change it
                    variant = next(r.variant for r in here if r.name == "vllm")
                return {
                    "found": bool(within),
                    "size": size,
                    "variant": variant.name,
                    "encoded_embeds": best.counters.encoded_embeds,
                    "variants_within": within,
                    "needs_scheduler_cls": variant.lookahead,
                    "manager_config": manager_config(variant, size),
                }
        return None

    def recommendation_lines(self) -> list[str]:
        rec = self.recommendation()
        if rec is None:
            return []
        floor = self.unbounded.counters.encoded_embeds if self.unbounded else 0
        size, name = rec["size"], rec["variant"]
        memory = format_bytes(size * self.bytes_per_embed)
        extra = _pct(rec["encoded_embeds"], floor)
        if not rec["found"]:
            sentence = (
                f"Recommendation: no size tried comes within {WITHIN:.0%} of an unbounded cache; the largest, "
                f"{size:,} embeddings ({memory}) with policy {name}, still encodes {extra} more: "
                "try larger sizes (--cache-sizes)."
            )
        else:
            policy = "any policy (vLLM's own included)" if "vllm" in rec["variants_within"] else f"policy {name}"
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
                        + _needs(best.variant)
                    )
            sentence += "."
        lines = [sentence]
        lever = self.lever_sentence()
        if lever:
            lines.append(lever)
        if rec["needs_scheduler_cls"]:
            lines.append(f"Lookahead needs vLLM started with {SCHEDULER_CLS}.")
        lines.append(f"manager_config: {json.dumps(rec['manager_config'])}")
        return lines

    def lever_sentence(self) -> str | None:
        """Which lever matters for this traffic: the KV prefix cache, or the encoder cache's size.
        They are compared by the embeddings each saves: prefix caching against vllm without it,
        an unbounded encoder cache against vllm at the default size."""
        base = self.baseline(self.headline)
        if base is None or self.unbounded is None:
            return None
        c = base.counters
        if not c.item_occurrences:
            return None
        by_size = c.encoded_embeds - self.unbounded.counters.encoded_embeds
        size_share = by_size / c.encoded_embeds if c.encoded_embeds else 0.0
        served = (
            f"The KV prefix cache serves {c.prefix_served_share:.0%} of item occurrences, "
            f"the encoder cache {c.cache_served_share:.0%}"
        )
        size_text = f"an unbounded encoder cache would save {by_size:,} embeddings more ({size_share:.0%})"
        if self.no_prefix is None:
            return f"{served}; {size_text}."
        without = self.no_prefix.counters.encoded_embeds
        by_prefix = without - c.encoded_embeds
        prefix_share = by_prefix / without if without else 0.0
        served += (
            f"; prefix caching saves {by_prefix:,} embeddings ({prefix_share:.0%} of what vllm encodes without it), "
            + size_text
        )
        if max(prefix_share, size_share) < WITHIN:
            return served + ": neither lever moves much on this traffic."
        if by_prefix >= by_size:
            second = "encoder-cache size comes second" if size_share >= WITHIN else "encoder-cache size barely matters"
            return served + (
                ": the prefix cache is the first lever here (keep prefix caching on, with a KV cache large enough "
                f"to hold the shared prefixes); {second}."
            )
        return served + ": the encoder cache's size is the first lever here."

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
                    f"{c.prefix_served_share:.1%}",
                    f"{c.cache_served_share:.1%}",
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
            "items: KV prefix",
            "enc. cache",
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
            "",
            "items: the share of item occurrences served by the KV prefix cache (never looked up) and by the "
            "encoder cache; prefix hits: prompt tokens found in the KV prefix cache.",
        ]
        oracle = next((r for r in runs if r.variant.policy == "oracle"), None)
        best = self.best()
        if best is not None and best.name != base.name:
            saved = base.counters.encoded_embeds - best.counters.encoded_embeds
            lines += [
                "",
                f"Best policy here: {best.name}{_needs(best.variant)}, {saved:,} fewer embeddings encoded than "
                f"{base.name} ({_pct(best.counters.encoded_embeds, base.counters.encoded_embeds)}), encoder time "
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
        if self.no_prefix is not None:
            n = self.no_prefix.counters
            lines.append(
                f"Without prefix caching {base.name} would encode {n.encoded_embeds:,} embeddings "
                f"({_pct(n.encoded_embeds, base.counters.encoded_embeds)})."
            )
        return lines

    def sweep_table(self) -> list[str]:
        names = self.sweep_variants()
        header = ["cache size", "memory", *names]
        if self.unbounded is not None:
            header.append("best policy vs unbounded")
        rows = []
        floor = self.unbounded.counters.encoded_embeds if self.unbounded else 0
        for size in self.sizes():
            row = [f"{size:,}", format_bytes(size * self.bytes_per_embed)]
            best: RunResult | None = None
            for name in names:
                run = self.sweep_run(name, size)
                if run is None:
                    row.append("-")
                    continue
                c = run.counters
                miss = c.encoded_embeds / max(c.encoded_embeds + c.hit_embeds, 1)
                row.append(f"{c.encoded_embeds:,} ({miss:.0%} miss)")
                if run.variant.policy != "oracle" and (best is None or c.encoded_embeds < best.counters.encoded_embeds):
                    best = run
            if self.unbounded is not None:
                row.append(f"{_pct(best.counters.encoded_embeds, floor)} {best.name}" if best is not None else "-")
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
        lines = [self.header(), *self.notes, ""]
        if self.headline:
            lines += self.headline_table()
        if self.sweep:
            if self.headline:
                lines.append("")
            lines += self.sweep_table()
        if self.host is not None and self.host.table:
            lines += ["", *self.host.table_lines(self)]
        recommendation = self.recommendation_lines()
        if self.host is not None:
            recommendation += self.host.recommendation_lines(self)
        if recommendation:
            lines += ["", *recommendation]
        return "\n".join(lines)

    # JSON

    def to_json(self, config: Any) -> dict[str, Any]:
        def run(r: RunResult) -> dict[str, Any]:
            variant = asdict(r.variant)
            if r.variant.host is None:
                del variant["host"]
            return {
                "name": r.name,
                "variant": variant,
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
        by_size = sorted(self.sweep, key=lambda r: (r.encoder_cache_size, r.name))
        host = {} if self.host is None else {"host_tier": self.host.to_json(self, run)}
        return {
            "workload": config,
            "engine": self.engine,
            "limits": asdict(self.limits),
            "cost": asdict(self.cost),
            "bytes_per_embed": self.bytes_per_embed,
            "default_cache_size": self.default_size,
            "notes": self.notes,
            "headline": [run(r) for r in self.headline],
            "best_policy": best.name if best is not None else None,
            "best_policy_needs_scheduler_cls": best.variant.lookahead if best is not None else None,
            "sweep": [run(r) for r in by_size],
            "search": [run(r) for r in sorted(self.search, key=lambda r: (r.encoder_cache_size, r.name))],
            "unbounded": run(self.unbounded) if self.unbounded is not None else None,
            "no_prefix_caching": run(self.no_prefix) if self.no_prefix is not None else None,
            "recommendation": self.recommendation(),
            "recommendation_text": "\n".join(self.recommendation_lines()) or None,
            **host,
        }
