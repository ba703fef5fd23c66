"""``python -m encoder_cache simulate``: replay a workload (generated or a
trace) through every chosen eviction policy and cache size, and say which
policy and how much cache to use.

Every option is checked before anything runs; a bad one is reported in one
line, ``encoder_cache simulate: error: ...``, naming the flag, with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from typing import Any, TextIO

from encoder_cache.simulator import oracle
from encoder_cache.simulator.cost import DEFAULT_PER_EMBED_SQ_US, DEFAULT_PER_EMBED_US, EncoderCost
from encoder_cache.simulator.engine import simulate
from encoder_cache.simulator.host_search import HostSection, fill_host
from encoder_cache.simulator.host_tier import HOST_POLICIES
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.options import (
    DEFAULT_SIZES,
    DEFAULT_STEP_SECONDS,
    DTYPE_BYTES,
    FLAGS,
    PLOT_FORMATS,
    add_arguments,
    flagged,
    given,
)
from encoder_cache.simulator.plot import plot
from encoder_cache.simulator.progress import Progress
from encoder_cache.simulator.report import Report
from encoder_cache.simulator.results import SimulationError
from encoder_cache.simulator.routing_cli import check_routing_flags, run_routing
from encoder_cache.simulator.routing_report import RoutingReport
from encoder_cache.simulator.sweep import Engine, Runner, fill, planned_runs
from encoder_cache.simulator.trace import TraceError, TraceWorkload, write_trace
from encoder_cache.simulator.variants import (
    BEHAVIOURS,
    IMPLEMENTATIONS,
    Variant,
    available_policies,
    supports_lookahead,
)
from encoder_cache.simulator.workloads import KEEP_IN_MEMORY, WorkloadConfig, generate

__all__ = ["PROG", "UsageError", "add_arguments", "main", "run"]

PROG = "encoder_cache simulate"


class UsageError(Exception):
    """A bad option value: reported in one line, exit code 2."""


# Validation: everything before the first run.


def _writable_file(flag: str, path: str, formats: tuple[str, ...] | None) -> str:
    """The path that will be written, or UsageError. Adds ``.png`` to a plot path without an extension."""
    if path == "" or path.endswith(os.sep) or os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory; give a file name, such as {os.path.join(path or '.', 'out')}")
    if formats is not None:
        extension = os.path.splitext(path)[1].lower().lstrip(".")
        if not extension:
            path += ".png"
        elif extension not in formats:
            raise UsageError(f"{flag} {path}: unsupported format .{extension}; use one of .{', .'.join(formats)}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"{flag} {path}: no directory {directory}")
    try:
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {directory}: {exc.strerror}") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the file is not writable")
    return path


def _memory(args: argparse.Namespace) -> tuple[int, str]:
    if args.bytes_per_embed is not None:
        if args.hidden_size is not None or args.dtype is not None:
            raise UsageError("--bytes-per-embed replaces --hidden-size and --dtype: give one or the other")
        if args.bytes_per_embed <= 0:
            raise UsageError(f"--bytes-per-embed must be > 0, got {args.bytes_per_embed}")
        return args.bytes_per_embed, "--bytes-per-embed"
    hidden = 3584 if args.hidden_size is None else args.hidden_size
    if hidden <= 0:
        raise UsageError(f"--hidden-size must be > 0, got {hidden}")
    dtype = args.dtype or "bfloat16"
    return hidden * DTYPE_BYTES[dtype], f"hidden size {hidden}, {dtype}"


def _variants(args: argparse.Namespace) -> list[Variant]:
    if args.behaviour is not None:
        unknown = [b for b in args.behaviour if b not in BEHAVIOURS]
        if unknown:
            raise UsageError(f"--behaviour {unknown[0]}: unknown; choose from {', '.join(BEHAVIOURS)}")
        if args.policy is not None or args.lookahead or args.impl not in (None, ["python"]):
            raise UsageError("--behaviour compares the vllm policy in python: drop --policy, --lookahead and --impl")
        if args.engine == "vllm":
            raise UsageError("--behaviour runs the python twin, in the built-in model only (drop --engine vllm)")
        return [Variant("vllm", False, "python", b, label=b) for b in args.behaviour]
    implementations = args.impl or []
    unknown = [i for i in implementations if i not in IMPLEMENTATIONS]
    if unknown:
        raise UsageError(f"--impl {unknown[0]}: unknown; choose from {', '.join(IMPLEMENTATIONS)}")
    offered = {i: available_policies(i) for i in IMPLEMENTATIONS}
    known = tuple(dict.fromkeys([*offered["rust"], *offered["python"]]))
    if args.engine == "vllm":
        # vLLM's hooks take the compiled manager; the oracle and the twin live in the model only.
        if implementations not in ([], ["rust"]):
            raise UsageError("--impl: --engine vllm runs the compiled manager (rust) only")
        implementations = ["rust"]
        known = offered["rust"]
        if args.policy is not None and "oracle" in args.policy:
            raise UsageError("--policy oracle: the oracle runs in the built-in model only (drop --engine vllm)")
    elif oracle.AVAILABLE:
        known += ("oracle",)
    policies = args.policy or list(known)
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise UsageError(f"--policy {unknown[0]}: unknown; choose from {', '.join(known)}")
    if args.lookahead:
        modes = [True]
    elif args.no_lookahead:
        modes = [False]
    else:
        modes = [False, True]
    chosen = implementations or [None]
    variants = []
    for implementation in chosen:
        for policy in policies:
            if policy == "oracle":
                if implementation in (None, chosen[0]):
                    variants.append(Variant("oracle", False, "python"))
                continue
            for lookahead in modes:
                impl = implementation
                if impl is None:  # rust when it offers the policy (and the marks), else python
                    rust_ok = policy in offered["rust"] and (not lookahead or supports_lookahead("rust"))
                    impl = "rust" if rust_ok else "python"
                if policy not in offered[impl]:
                    raise UsageError(
                        f"--policy {policy}: the {impl} manager does not offer it (it has {', '.join(offered[impl])})"
                    )
                if lookahead and not supports_lookahead(impl):
                    if args.lookahead:
                        raise UsageError(f"--lookahead: the {impl} manager has no mark_waiting/unmark_waiting")
                    continue
                label = f"{impl}-{policy}{'+lookahead' if lookahead else ''}" if len(chosen) > 1 else None
                variants.append(Variant(policy, lookahead, impl, label=label))
    return variants


def _host_tiers(args: argparse.Namespace, bytes_per_embed: int, basis: str) -> tuple[list[int], list[str]] | None:
    """The host-tier sizes (bytes) and policies asked for, or None."""
    if args.host_cache_gib is None:
        if args.host_policy is not None:
            raise UsageError("--host-policy needs --host-cache-gib: the host tier's sizes")
        return None
    if args.behaviour is not None:
        raise UsageError("--behaviour compares release behaviours without a host tier: drop --host-cache-gib")
    if args.engine == "vllm":
        raise UsageError(
            "--host-cache-gib: the host tier runs in the built-in model only; the vLLM engine does not drive "
            "vLLM's ECCPUConnector (drop --engine vllm)"
        )
    policies = args.host_policy or list(HOST_POLICIES)
    unknown = [p for p in policies if p not in HOST_POLICIES]
    if unknown:
        raise UsageError(f"--host-policy {unknown[0]}: unknown; choose from {', '.join(HOST_POLICIES)}")
    sizes = [round(gib * (1 << 30)) for gib in args.host_cache_gib]
    if min(sizes) < bytes_per_embed:
        raise UsageError(
            f"--host-cache-gib {min(args.host_cache_gib):g}: holds no embedding of {bytes_per_embed:,} bytes ({basis})"
        )
    return sorted(set(sizes)), policies


def _engine(args: argparse.Namespace) -> Engine:
    """The function that runs one variant: the built-in model, or vLLM's own scheduler."""
    if args.engine != "vllm":
        return simulate
    from encoder_cache.simulator import vllm_engine

    try:
        vllm_engine.require()
    except vllm_engine.EngineUnavailable as exc:
        raise UsageError(str(exc)) from None
    return vllm_engine.simulate_vllm


def _workload(args: argparse.Namespace, step_seconds: float) -> Any:
    if args.trace is not None:
        shaping = [f"--{n.replace('_', '-')}" for n in given(args, WorkloadConfig)]
        if shaping:
            raise UsageError(
                f"{FLAGS.get(shaping[0][2:].replace('-', '_'), shaping[0])} shapes a built-in workload; --trace replays a file"
            )
        if args.export_trace is not None:
            raise UsageError("--export-trace writes a built-in workload; drop --trace")
        if not os.path.isfile(args.trace):
            raise UsageError(f"--trace {args.trace}: no such file")
        try:
            return TraceWorkload(args.trace, step_seconds)
        except TraceError as exc:
            raise UsageError(f"--trace: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--trace {args.trace}: cannot read it: {exc}") from None
    try:
        config = WorkloadConfig(**given(args, WorkloadConfig))
    except ValueError as exc:
        raise UsageError(flagged(str(exc))) from None
    return generate(config)


def _max_tokens(workload: Any) -> int:
    """The longest request's tokens, or 0 when a streamed workload does not know (the run checks each)."""
    if isinstance(workload, TraceWorkload):
        return workload.scan.max_tokens
    return workload.max_tokens() or 0


def _run_routing(
    args: argparse.Namespace,
    out: TextIO,
    limits: SchedulerLimits,
    cost: EncoderCost,
    bytes_per_embed: int,
    step_seconds: float,
) -> RoutingReport | None:
    cache_sizes = None
    if args.cache_sizes is not None:
        try:
            cache_sizes = args.cache_sizes.embeds(bytes_per_embed)
        except ValueError as exc:
            raise UsageError(f"--cache-sizes: {exc}") from None

    def workload() -> Any:
        loaded = _workload(args, step_seconds)
        if _max_tokens(loaded) > limits.kv_tokens:
            raise UsageError(
                f"a request needs more tokens of KV cache than the {limits.kv_tokens:,} --kv-capacity "
                f"{limits.kv_capacity:,} holds; raise it or shrink the workload"
            )
        if not loaded.max_embeds_per_item():
            out.write(f"{loaded.describe()}: no request has a multimodal item: nothing to route by.\n")
            return None
        return loaded

    try:
        return run_routing(
            args,
            out,
            limits=limits,
            cost=cost,
            bytes_per_embed=bytes_per_embed,
            step_seconds=step_seconds,
            cache_sizes=cache_sizes,
            workload=workload,
        )
    except ValueError as exc:
        raise UsageError(flagged(str(exc))) from None


def run(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> Report | RoutingReport | None:
    """Run what ``args`` describe; the report goes to ``out`` (stdout), the
    progress bar to ``err`` (stderr) when it is a terminal."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    # Everything is checked before the first run.
    step_seconds = DEFAULT_STEP_SECONDS if args.step_seconds is None else args.step_seconds
    if step_seconds <= 0:
        raise UsageError(f"--step-seconds must be > 0, got {step_seconds:g}")
    try:
        limits = SchedulerLimits(
            **given(args, SchedulerLimits),
            prefix_caching=not args.no_prefix_caching,
            async_scheduling=not args.no_async_scheduling,
            reserve_full_isl=not args.no_scheduler_reserve_full_isl,
        )
        cost = EncoderCost(
            DEFAULT_PER_EMBED_US if args.encoder_us_per_embed is None else args.encoder_us_per_embed,
            DEFAULT_PER_EMBED_SQ_US if args.encoder_us_per_embed_sq is None else args.encoder_us_per_embed_sq,
        )
    except ValueError as exc:
        message = (
            str(exc)
            .replace("per_embed_sq_us", "--encoder-us-per-embed-sq")
            .replace("per_embed_us", "--encoder-us-per-embed")
        )
        raise UsageError(flagged(message)) from None
    bytes_per_embed, basis = _memory(args)
    host_tiers = _host_tiers(args, bytes_per_embed, basis)
    unrouted = check_routing_flags(args)
    if unrouted is not None:
        raise UsageError(unrouted)
    if args.replicas is not None:
        if host_tiers is not None:
            raise UsageError("--host-cache-gib sizes one engine's host tier: drop --replicas")
        return _run_routing(args, out, limits, cost, bytes_per_embed, step_seconds)
    engine = _engine(args)
    jobs = (1 if args.engine == "vllm" else min(2, os.cpu_count() or 1)) if args.jobs is None else args.jobs
    if jobs <= 0:
        raise UsageError(f"--jobs must be > 0, got {jobs}")
    export = None if args.export_trace is None else _writable_file("--export-trace", args.export_trace, None)
    variants = [] if export is not None else _variants(args)
    plot_path = None
    if host_tiers is not None and export is not None:
        raise UsageError("--host-cache-gib runs a simulation; --export-trace only writes the workload")
    if args.plot is not None:
        if export is not None:
            raise UsageError("--plot draws a simulation; --export-trace only writes the workload")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(
                "--plot needs matplotlib: pip install matplotlib (or, in the encoder-cache checkout, "
                "pip install -e '.[plot]')"
            ) from None
        plot_path = _writable_file("--plot", args.plot, PLOT_FORMATS)
    if args.cache_sizes is not None and args.no_sweep:
        raise UsageError("--no-sweep and --cache-sizes contradict each other: give one")
    cache_sizes = None
    if args.cache_sizes is not None:
        try:
            cache_sizes = args.cache_sizes.embeds(bytes_per_embed)
        except ValueError as exc:
            raise UsageError(f"--cache-sizes: {exc} (at {bytes_per_embed:,} bytes per embedding, {basis})") from None
    workload = _workload(args, step_seconds)
    notes: list[str] = []
    largest = _max_tokens(workload)
    if largest > limits.kv_tokens:
        raise UsageError(
            f"a request needs {largest:,} tokens of KV cache, more than the {limits.kv_tokens:,} --kv-capacity "
            f"{limits.kv_capacity:,} holds (whole 16-token blocks, one kept out of the pool as vLLM does); "
            "raise it or shrink the workload"
        )
    if export is not None:
        with open(export, "w", encoding="utf-8") as handle:
            count = write_trace(workload.requests(), handle, step_seconds)
        out.write(f"wrote {count:,} requests to {export} ({step_seconds:g} s per step)\n")
        return None

    description = workload.describe()
    if not workload.max_embeds_per_item():
        out.write(
            f"{description}: no request has a multimodal item, so the encoder cache has nothing to do "
            "and there is nothing to compare.\n"
        )
        return None
    if args.policy is None and workload.num_requests > KEEP_IN_MEMORY:
        variants = [v for v in variants if v.policy != "oracle"]
        notes.append(
            f"(the oracle is left out above {KEEP_IN_MEMORY:,} requests: it keeps every item occurrence in "
            "memory; --policy oracle asks for it)"
        )
    _, default_size = limits.encoder_budget(workload.max_embeds_per_item())
    if host_tiers is not None:
        item = max(workload.max_embeds_per_item().values())
        if min(host_tiers[0]) // bytes_per_embed < item:
            raise UsageError(
                f"--host-cache-gib {min(args.host_cache_gib):g}: holds {min(host_tiers[0]) // bytes_per_embed:,} "
                f"embeddings, fewer than the largest item's {item:,} (vLLM's host region refuses such an item)"
            )
    report = Report(
        description,
        limits,
        cost,
        bytes_per_embed,
        basis,
        default_size,
        behaviour=args.behaviour is not None,
        engine=args.engine,
        notes=notes,
        host=None if host_tiers is None else HostSection(step_seconds),
    )
    sweep = not args.no_sweep and args.behaviour is None
    explicit = args.cache_sizes is not None
    sizes: list[int | None] = [None if s == default_size else s for s in (cache_sizes or DEFAULT_SIZES)]
    bar = None
    if not args.no_progress and err.isatty():
        total = planned_runs(len(variants), len(sizes), sweep, explicit)
        bar = Progress(total * workload.num_requests, err)
    runner = Runner(workload, limits, cost, args.check, jobs, bar, engine)
    try:
        fill(report, runner, variants, sizes, sweep, explicit)
        if host_tiers is not None:
            gpu_sizes = [None] if cache_sizes is None else list(dict.fromkeys([None, *sizes]))
            fill_host(report, report.host, runner, *host_tiers, sweep, gpu_sizes)
    except ValueError as exc:
        raise UsageError(flagged(str(exc))) from None
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        config = asdict(workload.config) if not isinstance(workload, TraceWorkload) else {"trace": args.trace}
        data = report.to_json(config)
        if plot_path is not None:
            data["plot"] = plot_path
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        out.write(report.text() + "\n")
    if plot_path is not None:
        plot(report, plot_path)
        if not args.json:
            out.write(f"plot written to {plot_path}\n")
    return report


def main(args: argparse.Namespace) -> int:
    """Run, turning bad values into one line on stderr and exit code 2."""
    try:
        run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SimulationError as exc:
        print(f"{PROG}: simulation failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0
