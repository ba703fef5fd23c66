"""The host tier in a simulation's output: which host-tier runs one invocation
makes, their table, and the recommendation's host-tier part.

Every host-tier run puts vLLM's own GPU encoder cache (policy ``vllm``, at
vLLM's default size) in front of a host tier, as stock vLLM with the
``HostTierConnector`` would run. The table shows the sizes and policies asked
for (``--host-cache-gib``, ``--host-policy``). The recommendation searches on
its own, so it does not change with those flags: every host policy at
``HOST_SEARCH_BYTES``, from the smallest up, until a size comes within
``WITHIN`` of an unbounded GPU encoder cache, then one size between the last
too small and the first within reach (as the GPU search does). With ``--cache-sizes`` the
table also puts the host tiers behind each of those GPU encoder-cache sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from encoder_cache.simulator.host_tier import HOST_POLICIES, HostTier, ec_transfer_config
from encoder_cache.simulator.report import WITHIN, Report, _table, format_bytes
from encoder_cache.simulator.results import RunResult
from encoder_cache.simulator.sweep import Runner
from encoder_cache.simulator.variants import Variant

__all__ = ["HOST_SEARCH_BYTES", "HostSection", "fill_host"]

_GIB = 1 << 30
#: The host-tier sizes the recommendation tries, in bytes: 256 MiB, then 4x larger up to 256 GiB
#: (host servers commonly spare tens to hundreds of GiB).
HOST_SEARCH_BYTES = tuple((_GIB // 4) << (2 * i) for i in range(6))


def _pct(value: float, base: float) -> str:
    return f"{(value - base) / base:+.1%}" if base else "n/a"


def _rate(gib_per_second: float) -> str:
    return f"{gib_per_second:.3g}"


@dataclass
class HostSection:
    """The host-tier runs of one invocation and what the output says about them."""

    #: Seconds per scheduler step: turns loads per run into GiB/s.
    step_seconds: float
    #: The runs of the table (the sizes and policies asked for).
    table: list[RunResult] = field(default_factory=list)
    #: The runs the recommendation searches.
    search: list[RunResult] = field(default_factory=list)

    def rows(self, report: Report, runs: list[RunResult]) -> list[list[str]]:
        base = report.baseline(report.headline)
        rows = []
        for r in sorted(runs, key=lambda r: (r.encoder_cache_size, r.variant.host.size_bytes, r.variant.host.policy)):  # type: ignore[union-attr]
            host, h, c = r.variant.host, r.host, r.counters
            assert host is not None and h is not None
            rows.append(
                [
                    f"{r.encoder_cache_size:,}",
                    format_bytes(host.size_bytes),
                    host.policy,
                    f"{c.encoded_embeds:,}",
                    _pct(c.encoded_embeds, base.counters.encoded_embeds) if base is not None else "-",
                    f"{h.loaded_embeds:,} ({h.loads:,} items)",
                    f"{h.loaded_bytes / _GIB:,.1f}",
                    _rate(h.load_gib_per_second(c.steps, self.step_seconds)),
                    _rate(h.peak_gib_per_second(self.step_seconds)),
                    f"{h.hit_rate:.1%}",
                ]
            )
        return rows

    def table_lines(self, report: Report) -> list[str]:
        if not self.table:
            return []
        header = [
            "GPU cache",
            "host tier",
            "policy",
            "GPU-encoded embeds",
            "vs vllm",
            "loaded from host",
            "load GiB",
            "GiB/s",
            "peak GiB/s",
            "host hits",
        ]
        return [
            "With a host-memory tier (vLLM's ECCPUConnector as HostTierConnector) behind vLLM's GPU encoder cache "
            f"(policy vllm; GPU cache in embeddings, vLLM's default {report.default_size:,}); vs vllm: against vllm "
            f"alone at the default size; GiB/s: the load volume over the run at {self.step_seconds:g} s per step, "
            "peak: the busiest step; host hits: loads / items asked of the host tier:",
            "",
            *_table(header, self.rows(report, self.table)),
        ]

    def recommendation(self, report: Report) -> dict[str, Any] | None:
        """The smallest searched host tier whose best policy comes within ``WITHIN``
        of an unbounded GPU encoder cache (or the largest, ``found`` false), and
        whether it beats growing the GPU cache."""
        if report.unbounded is None or not self.search:
            return None
        floor = report.unbounded.counters.encoded_embeds
        sizes = sorted({r.variant.host.size_bytes for r in self.search})  # type: ignore[union-attr]
        for index, size in enumerate(sizes):
            here = [r for r in self.search if r.variant.host.size_bytes == size]  # type: ignore[union-attr]
            best = min(here, key=lambda r: (r.counters.encoded_embeds, HOST_POLICIES.index(r.variant.host.policy)))  # type: ignore[union-attr]
            found = best.counters.encoded_embeds <= floor * (1 + WITHIN)
            if found or index == len(sizes) - 1:
                gpu = report.recommendation()
                gpu_grows = gpu is None or not gpu["found"] or gpu["size"] > report.default_size
                base = report.baseline(report.headline)
                assert best.variant.host is not None and best.host is not None
                return {
                    "found": found,
                    "host_cache_bytes": size,
                    "host_cache_gib": size / _GIB,
                    "policy": best.variant.host.policy,
                    "encoded_embeds": best.counters.encoded_embeds,
                    "saved_embeds": (base.counters.encoded_embeds - best.counters.encoded_embeds) if base else None,
                    "loaded_embeds": best.host.loaded_embeds,
                    "load_gib_per_second": best.host.load_gib_per_second(best.counters.steps, self.step_seconds),
                    "peak_load_gib_per_second": best.host.peak_gib_per_second(self.step_seconds),
                    "host_hit_rate": best.host.hit_rate,
                    "policies_within": [
                        r.variant.host.policy  # type: ignore[union-attr]
                        for r in here
                        if r.counters.encoded_embeds <= floor * (1 + WITHIN)
                    ],
                    # A host tier is worth recommending when it gets there and the GPU cache would have to grow.
                    "beats_growing_gpu_cache": found and gpu_grows,
                    "ec_transfer_config": ec_transfer_config(best.variant.host),
                }
        return None

    def recommendation_lines(self, report: Report) -> list[str]:
        rec = self.recommendation(report)
        if rec is None:
            return []
        base = report.baseline(report.headline)
        floor = report.unbounded.counters.encoded_embeds if report.unbounded else 0
        size = format_bytes(rec["host_cache_bytes"])
        saved = rec["saved_embeds"]
        share = saved / base.counters.encoded_embeds if base is not None and base.counters.encoded_embeds else 0.0
        what = (
            f"a host tier of {size} with policy {rec['policy']} behind vLLM's default GPU encoder cache encodes "
            f"{saved:,} fewer embeddings than vllm alone ({share:.0%}), loading {rec['loaded_embeds']:,} embeddings "
            f"from host memory ({_rate(rec['load_gib_per_second'])} GiB/s on average, "
            f"{_rate(rec['peak_load_gib_per_second'])} GiB/s in the busiest step at {self.step_seconds:g} s per step; {rec['host_hit_rate']:.0%} of the items "
            "asked of it found)"
        )
        if not rec["found"]:
            return [
                f"Host tier: no host tier tried comes within {WITHIN:.0%} of an unbounded encoder cache; the largest, "
                + what
                + f", still encodes {_pct(rec['encoded_embeds'], floor)} more than unbounded."
            ]
        config = json.dumps(rec["ec_transfer_config"])
        if not rec["beats_growing_gpu_cache"]:
            return [f"Host tier: not needed, the GPU encoder cache recommended above is enough; for reference, {what}."]
        gpu = report.recommendation()
        instead = (
            "no GPU encoder-cache size tried gets there"
            if gpu is None or not gpu["found"]
            else f"the GPU encoder cache would have to grow to {gpu['size']:,} embeddings "
            f"({format_bytes(gpu['size'] * report.bytes_per_embed)})"
        )
        return [
            f"Host tier: rather than growing the GPU encoder cache, add {size} of host tier with policy "
            f"{rec['policy']}: {what}, within {WITHIN:.0%} of "
            f"an unbounded encoder cache ({_pct(rec['encoded_embeds'], floor)}), where {instead}.",
            "It needs VLLM_USE_V2_MODEL_RUNNER=1 and encoder_cache installed in vLLM's environment.",
            f"--ec-transfer-config '{config}'",
        ]

    def to_json(self, report: Report, run: Any) -> dict[str, Any]:
        def one(r: RunResult) -> dict[str, Any]:
            data = run(r)
            assert r.host is not None and r.variant.host is not None
            data["host_tier"] = {
                "bytes": r.variant.host.size_bytes,
                "policy": r.variant.host.policy,
                **r.host.as_dict(),
                "load_gib_per_second": r.host.load_gib_per_second(r.counters.steps, self.step_seconds),
                "peak_load_gib_per_second": r.host.peak_gib_per_second(self.step_seconds),
            }
            return data

        return {
            "step_seconds": self.step_seconds,
            "recommendation_text": "\n".join(self.recommendation_lines(report)) or None,
            "table": [one(r) for r in self.table],
            "search": [one(r) for r in self.search],
            "recommendation": self.recommendation(report),
        }


def _host_variant(size_bytes: int, policy: str, bytes_per_embed: int) -> Variant:
    return Variant(host=HostTier(size_bytes, policy, bytes_per_embed))


def fill_host(
    report: Report,
    section: HostSection,
    runner: Runner,
    sizes_bytes: list[int],
    policies: list[str],
    sweep: bool,
    gpu_sizes: list[int | None] | None = None,
) -> None:
    """Run the table's host tiers behind each of ``gpu_sizes`` (None: vLLM's
    default, the only one by default), and with ``sweep`` the recommendation's
    search (after ``sweep.fill``: it needs the unbounded run and the GPU recommendation)."""
    bpe = report.bytes_per_embed
    wanted: list[Any] = [
        (_host_variant(s, p, bpe), g) for g in (gpu_sizes or [None]) for s in sizes_bytes for p in policies
    ]
    runner.grow(runner.new_runs(wanted))
    section.table = runner.run(wanted)
    if not sweep or report.unbounded is None:
        return
    section.search = []
    largest_item = max(runner.workload.max_embeds_per_item().values())
    for size in HOST_SEARCH_BYTES:
        if size // bpe < largest_item:
            continue
        jobs: list[Any] = [(_host_variant(size, p, bpe), None) for p in HOST_POLICIES]
        runner.grow(runner.new_runs(jobs))
        section.search += runner.run(jobs)
        rec = section.recommendation(report)
        if rec is not None and rec["found"]:
            break
    # One finer size between the last one too small and the first one within reach.
    rec = section.recommendation(report)
    known = sorted({r.variant.host.size_bytes for r in section.search})  # type: ignore[union-attr]
    if rec is not None and rec["found"] and known.index(rec["host_cache_bytes"]) > 0:
        below = known[known.index(rec["host_cache_bytes"]) - 1]
        step = _GIB // 4
        middle = round((below * rec["host_cache_bytes"]) ** 0.5 / step) * step
        if below < middle < rec["host_cache_bytes"]:
            jobs = [(_host_variant(middle, p, bpe), None) for p in HOST_POLICIES]
            runner.grow(runner.new_runs(jobs))
            section.search += runner.run(jobs)
