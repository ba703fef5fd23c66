"""``simulate --replicas N [--routing ...]``: the routing table. Checks the
routing options (one line naming the flag, as the rest of the command line
does), runs every routing choice on the same arrivals, prints the table or JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from encoder_cache.simulator.cluster import simulate_routing
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.routers import DEFAULT_SLACK, GUESS_ENTRIES, ROUTINGS
from encoder_cache.simulator.routing_report import RoutingReport
from encoder_cache.simulator.variants import Variant, available_policies, supports_lookahead

__all__ = ["ROUTING_FLAGS", "check_routing_flags", "run_routing"]

#: Flags that only mean something with --replicas: (attribute, flag).
ROUTING_FLAGS = (
    ("routing", "--routing"),
    ("overload_slack", "--overload-slack"),
    ("guess_entries", "--guess-entries"),
    ("no_sticky_sessions", "--no-sticky-sessions"),
)
#: Options of the policy comparison that a routing run does not take: (attribute, flag).
_NOT_ROUTED = (
    ("behaviour", "--behaviour"),
    ("plot", "--plot"),
    ("export_trace", "--export-trace"),
    ("impl", "--impl"),
)


def check_routing_flags(args: argparse.Namespace) -> str | None:
    """Without --replicas: the first routing flag given, as an error message; else None."""
    if getattr(args, "replicas", None) is not None:
        return None
    for name, flag in ROUTING_FLAGS:
        if getattr(args, name, None) not in (None, False):
            return f"{flag} routes across replicas: give --replicas N too"
    return None


def _variant(args: argparse.Namespace) -> Variant:
    policies = args.policy or ["vllm"]
    if len(policies) > 1:
        raise ValueError(f"--replicas compares routing with one policy: give one --policy, got {','.join(policies)}")
    policy = policies[0]
    offered = available_policies("rust")
    if policy == "oracle":
        raise ValueError("--policy oracle needs the whole run in advance; routing runs a real policy")
    if policy not in offered:
        raise ValueError(f"--policy {policy}: unknown; choose from {', '.join(offered)}")
    if args.lookahead and not supports_lookahead("rust"):
        raise ValueError("--lookahead: the rust manager has no mark_waiting/unmark_waiting")
    return Variant(policy, bool(args.lookahead), "rust")


def run_routing(
    args: argparse.Namespace,
    out: TextIO,
    *,
    limits: SchedulerLimits,
    cost: EncoderCost,
    bytes_per_embed: int,
    step_seconds: float,
    cache_sizes: list[int] | None,
    workload: Callable[[], Any],
) -> RoutingReport | None:
    """Run the routing table; ValueError (a usage error) for a bad option, before anything runs."""
    replicas = args.replicas
    if replicas < 1 or replicas > 256:
        raise ValueError(f"--replicas must be between 1 and 256, got {replicas}")
    if getattr(args, "engine", "model") != "model":
        raise ValueError("--replicas runs the built-in model only: drop --engine vllm")
    for name, flag in _NOT_ROUTED:
        if getattr(args, name, None) is not None:
            raise ValueError(f"{flag} belongs to the policy comparison, not to --replicas: drop it")
    routings = args.routing or list(ROUTINGS)
    unknown = [r for r in routings if r not in ROUTINGS]
    if unknown:
        raise ValueError(f"--routing {unknown[0]}: unknown; choose from {', '.join(ROUTINGS)}")
    slack = DEFAULT_SLACK if args.overload_slack is None else args.overload_slack
    if slack < 0:
        raise ValueError(f"--overload-slack must be >= 0, got {slack}")
    entries = GUESS_ENTRIES if args.guess_entries is None else args.guess_entries
    if entries < 1:
        raise ValueError(f"--guess-entries must be >= 1, got {entries}")
    if cache_sizes is not None and len(cache_sizes) != 1:
        raise ValueError("--cache-sizes: --replicas runs one size per replica: give one")
    variant = _variant(args)
    loaded = workload()
    if loaded is None:
        return None
    results = [
        simulate_routing(
            loaded,
            limits,
            variant,
            replicas,
            routing,
            cache_size=cache_sizes[0] if cache_sizes else None,
            cost=cost,
            sticky=not args.no_sticky_sessions,
            check=args.check,
            slack=slack,
            guess_entries=entries,
        )
        for routing in routings
    ]
    report = RoutingReport(
        loaded.describe(),
        results,
        policy=variant.name,
        bytes_per_embed=bytes_per_embed,
        step_seconds=step_seconds,
        slack=slack,
        guess_entries=entries,
        limits=f"{limits.max_num_batched_tokens:,} tokens and {limits.max_num_seqs} requests per step, a KV cache "
        f"of {limits.kv_capacity:,} tokens, prefix caching {'on' if limits.prefix_caching else 'off'}",
    )
    if args.json:
        config = asdict(loaded.config) if hasattr(loaded, "config") else {"trace": args.trace}
        json.dump(report.to_json(config), out, indent=2)
        out.write("\n")
    else:
        out.write(report.text() + "\n")
    return report
