"""The routing table: one row per routing choice, and the lines that say what
exact cache events (the encoder cache's, and with ``cache-aware+kv`` the KV
cache's too) buy over round-robin and over the router-side LRU guess."""

from __future__ import annotations

from typing import Any

from encoder_cache.simulator.cluster import RoutingResult
from encoder_cache.simulator.report import format_bytes

__all__ = ["RoutingReport"]


def _pct(value: float, base: float) -> str:
    return f"{(value - base) / base:+.1%}" if base else "n/a"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


class RoutingReport:
    """``results`` in the order run; ``description`` names the traffic."""

    def __init__(
        self,
        description: str,
        results: list[RoutingResult],
        *,
        policy: str,
        bytes_per_embed: int,
        step_seconds: float,
        slack: int,
        guess_entries: int,
        limits: str = "vLLM's scheduler limits",
    ) -> None:
        self.limits = limits
        self.description = description
        self.results = results
        self.policy = policy
        self.bytes_per_embed = bytes_per_embed
        self.step_seconds = step_seconds
        self.slack = slack
        self.guess_entries = guess_entries

    def _by_name(self) -> dict[str, RoutingResult]:
        return {r.routing: r for r in self.results}

    def text(self) -> str:
        first = self.results[0]
        size = first.encoder_cache_size
        lines = [
            self.description,
            f"{first.replicas} replicas behind one router; each replica: the {self.policy} policy, an encoder cache "
            f"of {size:,} embeddings ({format_bytes(size * self.bytes_per_embed)}), {self.limits}; "
            + ("sessions stick to their first replica" if first.sticky else "every session turn routed afresh"),
            f"(a replica is overloaded above {self.slack} requests more than the least-loaded one; "
            f"the LRU guess keeps {self.guess_entries:,} item hashes per replica)",
            "",
        ]
        base = self._by_name().get("round-robin")
        header = [
            "routing",
            "encoded embeds",
            "vs round-robin",
            "re-encoded",
            "cached at placement",
            "spared at placement",
            "guess right",
            "load imbalance",
            "drain (steps)",
            "drain s",
            "mean latency s",
        ]
        rows = []
        for r in self.results:
            precision = r.guess_precision
            rows.append(
                [
                    r.routing,
                    f"{r.counters.encoded_embeds:,}",
                    _pct(r.counters.encoded_embeds, base.counters.encoded_embeds) if base else "n/a",
                    f"{r.counters.recomputed_embeds:,}",
                    f"{r.placed_cached_embeds / r.placed_embeds:.1%}" if r.placed_embeds else "n/a",
                    f"{r.placed_spared_embeds / r.placed_embeds:.1%}" if r.placed_embeds else "n/a",
                    "-" if precision is None else f"{precision:.1%}",
                    f"{r.load_imbalance:.3f}",
                    f"{r.drain_steps:,}",
                    f"{r.drain_steps * self.step_seconds:,.1f}",
                    f"{r.mean_latency_steps * self.step_seconds:,.2f}",
                ]
            )
        lines += _table(header, rows)
        lines += ["", *self.headline()]
        return "\n".join(lines)

    def headline(self) -> list[str]:
        """What the exact-event routers save against round-robin and the LRU guess, with load imbalance."""
        by = self._by_name()
        out = []
        for name in ("cache-aware", "cache-aware+placed", "cache-aware+kv"):
            aware = by.get(name)
            if aware is None:
                continue
            parts = [
                f"{_pct(aware.counters.encoded_embeds, by[other].counters.encoded_embeds)} against {other} "
                f"(load imbalance {aware.load_imbalance:.3f} against {by[other].load_imbalance:.3f})"
                for other in ("round-robin", "lru-guess")
                if other in by
            ]
            if parts:
                out.append(f"{name} routing encodes " + "; ".join(parts) + ".")
        guess = by.get("lru-guess")
        if guess is not None and guess.guess_precision is not None:
            out.append(
                f"The LRU guess believed {guess.believed_embeds:,} embeddings cached where it placed requests; "
                f"{guess.guess_precision:.1%} of them were (the rest had been evicted)."
            )
        return out

    def to_json(self, config: dict[str, Any]) -> dict[str, Any]:
        by = self._by_name()

        def saving(name: str, other: str) -> float | None:
            a, o = by.get(name), by.get(other)
            if a is None or o is None or not o.counters.encoded_embeds:
                return None
            return a.counters.encoded_embeds / o.counters.encoded_embeds - 1

        return {
            "workload": config,
            "description": self.description,
            "policy": self.policy,
            "step_seconds": self.step_seconds,
            "bytes_per_embed": self.bytes_per_embed,
            "overload_slack": self.slack,
            "guess_entries": self.guess_entries,
            "results": [r.as_dict() for r in self.results],
            "cache_aware_vs_round_robin": saving("cache-aware", "round-robin"),
            "cache_aware_vs_lru_guess": saving("cache-aware", "lru-guess"),
            "cache_aware_placed_vs_round_robin": saving("cache-aware+placed", "round-robin"),
            "cache_aware_placed_vs_lru_guess": saving("cache-aware+placed", "lru-guess"),
            "cache_aware_kv_vs_round_robin": saving("cache-aware+kv", "round-robin"),
            "cache_aware_kv_vs_lru_guess": saving("cache-aware+kv", "lru-guess"),
        }
