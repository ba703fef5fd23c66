"""``python -m encoder_cache simulate``: replay a workload (generated or a
trace) through every chosen eviction policy and cache size, and say which
policy and how much cache to use.

Every option is checked before anything runs; a bad one is reported in one
line, ``encoder_cache simulate: error: ...``, naming the flag, with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import MISSING, asdict, fields
from typing import Any, TextIO

from encoder_cache.simulator import oracle
from encoder_cache.simulator.cost import DEFAULT_PER_EMBED_SQ_US, DEFAULT_PER_EMBED_US, EncoderCost
from encoder_cache.simulator.report import Report, plot
from encoder_cache.simulator.scheduler import (
    BEHAVIOURS,
    IMPLEMENTATIONS,
    UNBOUNDED,
    RunResult,
    SchedulerLimits,
    SimulationError,
    Variant,
    available_policies,
    simulate,
    supports_lookahead,
)
from encoder_cache.simulator.trace import TraceError, TraceWorkload, write_trace
from encoder_cache.simulator.workloads import WorkloadConfig, generate

__all__ = ["PROG", "UsageError", "add_arguments", "main", "run"]

PROG = "encoder_cache simulate"
#: The sizes a sweep tries when none are given: vLLM's defaults (2,048 on
#: smaller GPUs, 8,192 for `vllm serve` on H100-class ones) and 4x, 16x more.
DEFAULT_SIZES = (2048, 8192, 32768, 131072)
#: How many more sizes (each 4x the last) the default sweep tries to get within 5% of unbounded.
MAX_EXTRA_SIZES = 3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "webp")
DEFAULT_STEP_SECONDS = 0.05


class UsageError(Exception):
    """A bad option value: reported in one line, exit code 2."""


# Parsers for option values (argparse reports their errors naming the flag).


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _range(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 2
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX or N (meaning N:N), got {text!r}")
    return values[0], values[1]


def _weights(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(_float(p) for p in text.split(":"))
    except argparse.ArgumentTypeError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected CHAT:VIDEO:POPULAR finite weights, got {text!r}")
    return values  # type: ignore[return-value]


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return list(dict.fromkeys(names))


def _sizes(text: str) -> list[int]:
    """``A,B,C`` or ``MIN:MAX`` (doubling from MIN up to MAX) or ``MIN:MAX:FACTOR``."""
    if ":" in text:
        parts = text.split(":")
        try:
            lo, hi = int(parts[0]), int(parts[1])
            factor = _float(parts[2]) if len(parts) == 3 else 2.0
        except (ValueError, IndexError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"expected A,B,C or MIN:MAX[:FACTOR], got {text!r}") from None
        if len(parts) > 3 or lo <= 0 or hi < lo or factor <= 1:
            raise argparse.ArgumentTypeError(
                f"expected MIN:MAX[:FACTOR] with 0 < MIN <= MAX and FACTOR > 1, got {text!r}"
            )
        sizes, size = [], float(lo)
        while size <= hi * (1 + 1e-9) and len(sizes) < 64:
            sizes.append(round(size))
            size *= factor
        return sorted(set(sizes))
    try:
        sizes = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A,B,C or MIN:MAX[:FACTOR], got {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"expected sizes > 0, got {text!r}")
    return sorted(set(sizes))


# Annotations are strings (postponed evaluation); each maps to its parser.
_PARSERS = {
    "str": str,
    "int": _int,
    "int | None": _int,
    "float": _float,
    "float | None": _float,
    "Range": _range,
    "tuple[float, float, float]": _weights,
}
#: field name -> the flag that sets it, for error messages.
_FLAGS: dict[str, str] = {}


def _config_options(parser: argparse.ArgumentParser, cls: type, title: str) -> Any:
    group = parser.add_argument_group(title)
    for f in fields(cls):
        meta = f.metadata
        if meta.get("cli") is False:
            continue
        default = f.default if f.default is not MISSING else None
        shown = ":".join(f"{v:g}" for v in default) if isinstance(default, tuple) else default
        metavar = meta.get("metavar") or ("MIN:MAX" if f.type == "Range" else None)
        help = meta["help"] + (f" (default: {shown})" if shown is not None else "")
        if f.type == "Range":
            help += "; N alone means N:N"
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        _FLAGS[f.name] = flag
        group.add_argument(
            flag,
            dest=f.name,
            type=_PARSERS[f.type],
            default=None,  # unset options leave the config's own default
            choices=meta.get("choices"),
            metavar=metavar,
            help=help,
        )
    return group


def _given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if f.metadata.get("cli") is not False and getattr(args, f.name) is not None
    }


def _flagged(message: str) -> str:
    """A config's message with its field names replaced by the flags that set them."""
    for name in sorted(_FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", _FLAGS[name], message)
    return message


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("what to compare")
    run.add_argument(
        "--policy",
        type=_names,
        metavar="LIST",
        help="eviction policies to compare, from encoder_cache.POLICIES, plus oracle (Belady, offline, "
        "the ceiling) (default: all)",
    )
    looks = run.add_mutually_exclusive_group()
    looks.add_argument(
        "--lookahead", action="store_true", help="only variants that mark waiting requests (default: with and without)"
    )
    looks.add_argument("--no-lookahead", action="store_true", help="only variants without waiting-queue marks")
    run.add_argument(
        "--cache-sizes",
        type=_sizes,
        metavar="SIZES",
        help="encoder-cache sizes to sweep, in embeddings: A,B,C or MIN:MAX[:FACTOR] (doubling by default); "
        "every policy runs at each (default: a short sweep for vllm and the best policy, "
        + ",".join(str(s) for s in DEFAULT_SIZES)
        + ", then 4x larger while no size is within 5%% of an unbounded cache, up to "
        + str(MAX_EXTRA_SIZES)
        + " more)",
    )
    run.add_argument("--no-sweep", action="store_true", help="only the default capacity: no sweep, no recommendation")
    run.add_argument(
        "--impl",
        type=_names,
        metavar="LIST",
        help="manager implementations: rust, python (default: rust for the policies it offers, python for the rest)",
    )
    run.add_argument(
        "--behaviour",
        type=_names,
        metavar="LIST",
        help="instead of policies, compare release behaviours of the vllm policy (python): fixed (vLLM 0.33), "
        "prefix (before vLLM PR #54284's fix), scan (the fix as first written); e.g. fixed,prefix",
    )
    source = parser.add_argument_group("traffic")
    source.add_argument("--trace", metavar="FILE.jsonl", help="replay this trace instead of a built-in workload")
    source.add_argument(
        "--export-trace",
        metavar="FILE.jsonl",
        help="write the built-in workload as a trace and exit (the format --trace reads)",
    )
    source.add_argument(
        "--step-seconds",
        type=_float,
        metavar="S",
        default=None,
        help=f"seconds per scheduler step, mapping trace times to steps (default: {DEFAULT_STEP_SECONDS})",
    )
    memory = parser.add_argument_group("memory (to show sizes in bytes)")
    memory.add_argument("--hidden-size", type=_int, metavar="N", help="the model's hidden size (default: 3584)")
    memory.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="the embeddings' dtype (default: bfloat16)")
    memory.add_argument(
        "--bytes-per-embed", type=_int, metavar="N", help="bytes per embedding (instead of hidden size and dtype)"
    )
    cost = parser.add_argument_group("encoder time model")
    cost.add_argument(
        "--encoder-us-per-embed",
        type=_float,
        metavar="US",
        help=f"encoder microseconds per embedding (default: {DEFAULT_PER_EMBED_US})",
    )
    cost.add_argument(
        "--encoder-us-per-embed-sq",
        type=_float,
        metavar="US",
        help="encoder microseconds per embedding squared, per item: attention within the item "
        f"(default: {DEFAULT_PER_EMBED_SQ_US})",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print JSON (everything in the tables) instead")
    out.add_argument(
        "--plot",
        metavar="PATH",
        help="also draw encoded embeddings against cache size (png, svg, pdf; needs matplotlib)",
    )
    out.add_argument("--check", action="store_true", help="verify the cache's accounting after every step (slow)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    out.add_argument(
        "--jobs", type=_int, metavar="N", help="runs in parallel processes (default: up to 2, one per CPU)"
    )
    _config_options(parser, WorkloadConfig, "built-in workload")
    scheduler = _config_options(parser, SchedulerLimits, "scheduler")
    scheduler.add_argument(
        "--no-prefix-caching", action="store_true", help="turn off the KV prefix cache (on by default, as in vLLM)"
    )


class Progress:
    """A one-line progress bar on a terminal, shown once the runs have taken
    ``delay`` seconds and redrawn at most every ``interval`` seconds."""

    def __init__(self, total: int, stream: TextIO, delay: float = 2.0, interval: float = 0.1) -> None:
        self.total, self.stream, self.interval = total, stream, interval
        self.drawn = time.monotonic() + delay - interval  # the first draw comes after ``delay``
        self.shown = False
        self.done = 0  # requests of the runs already finished
        self.label = ""

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.drawn < self.interval:
            return
        self.drawn = now
        self.shown = True
        fraction = min((self.done + done) / max(self.total, 1), 1.0)
        bar = "#" * int(30 * fraction)
        self.stream.write(f"\r[{bar:<30}] {fraction:4.0%} {self.label}")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


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
        return [Variant("vllm", False, "python", b, label=b) for b in args.behaviour]
    implementations = args.impl or []
    unknown = [i for i in implementations if i not in IMPLEMENTATIONS]
    if unknown:
        raise UsageError(f"--impl {unknown[0]}: unknown; choose from {', '.join(IMPLEMENTATIONS)}")
    offered = {i: available_policies(i) for i in IMPLEMENTATIONS}
    known = tuple(dict.fromkeys([*offered["rust"], *offered["python"]]))
    if oracle.AVAILABLE:
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


def _workload(args: argparse.Namespace, step_seconds: float) -> Any:
    if args.trace is not None:
        given = [f"--{n.replace('_', '-')}" for n in _given(args, WorkloadConfig)]
        if given:
            raise UsageError(
                f"{_FLAGS.get(given[0][2:].replace('-', '_'), given[0])} shapes a built-in workload; --trace replays a file"
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
        config = WorkloadConfig(**_given(args, WorkloadConfig))
    except ValueError as exc:
        raise UsageError(_flagged(str(exc))) from None
    return generate(config)


def _max_tokens(workload: Any) -> int:
    if isinstance(workload, TraceWorkload):
        return workload.scan.max_tokens
    return max((s.total_tokens for s in workload.specs), default=0)


# Running


def _one(job: tuple[Any, SchedulerLimits, Variant, int | None, EncoderCost, bool]) -> RunResult:
    workload, limits, variant, size, cost, check = job
    return simulate(workload, limits, variant, cache_size=size, cost=cost, check=check)


class _Runner:
    def __init__(
        self, workload: Any, limits: SchedulerLimits, cost: EncoderCost, check: bool, jobs: int, bar: Progress | None
    ):
        self.workload, self.limits, self.cost, self.check = workload, limits, cost, check
        self.jobs, self.bar = jobs, bar
        self.done: dict[tuple[Variant, int | None], RunResult] = {}

    def run(self, wanted: list[tuple[Variant, int | None]]) -> list[RunResult]:
        todo = [w for w in dict.fromkeys(wanted) if w not in self.done]
        if self.bar is not None:
            self.bar.label = f"{len(todo)} runs"
        if self.jobs <= 1 or len(todo) <= 1:
            for variant, size in todo:
                if self.bar is not None:
                    self.bar.label = variant.name
                progress = None if self.bar is None else self.bar.update
                self.done[(variant, size)] = simulate(
                    self.workload,
                    self.limits,
                    variant,
                    cache_size=size,
                    cost=self.cost,
                    check=self.check,
                    progress=progress,
                )
                self._advance()
        else:
            context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            with ProcessPoolExecutor(max_workers=min(self.jobs, len(todo)), mp_context=context) as pool:
                futures = {
                    pool.submit(_one, (self.workload, self.limits, v, s, self.cost, self.check)): (v, s)
                    for v, s in todo
                }
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for future in finished:
                        self.done[futures[future]] = future.result()
                        self._advance()
                    if self.bar is not None:
                        self.bar.update(0)
        return [self.done[w] for w in wanted]

    def _advance(self) -> None:
        if self.bar is not None:
            self.bar.done += self.workload.num_requests
            self.bar.update(0)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> Report | None:
    """Run what ``args`` describe; the report goes to ``out`` (stdout), the
    progress bar to ``err`` (stderr) when it is a terminal."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    # Everything is checked before the first run.
    step_seconds = DEFAULT_STEP_SECONDS if args.step_seconds is None else args.step_seconds
    if step_seconds <= 0:
        raise UsageError(f"--step-seconds must be > 0, got {step_seconds:g}")
    try:
        limits = SchedulerLimits(**_given(args, SchedulerLimits), prefix_caching=not args.no_prefix_caching)
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
        raise UsageError(_flagged(message)) from None
    bytes_per_embed, basis = _memory(args)
    jobs = min(2, os.cpu_count() or 1) if args.jobs is None else args.jobs
    if jobs <= 0:
        raise UsageError(f"--jobs must be > 0, got {jobs}")
    export = None if args.export_trace is None else _writable_file("--export-trace", args.export_trace, None)
    variants = [] if export is not None else _variants(args)
    plot_path = None
    if args.plot is not None:
        if export is not None:
            raise UsageError("--plot draws a simulation; --export-trace only writes the workload")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'encoder-cache[plot]'") from None
        plot_path = _writable_file("--plot", args.plot, PLOT_FORMATS)
    if args.cache_sizes is not None and args.no_sweep:
        raise UsageError("--no-sweep and --cache-sizes contradict each other: give one")
    workload = _workload(args, step_seconds)
    largest = _max_tokens(workload)
    if largest > limits.kv_capacity:
        raise UsageError(
            f"a request needs {largest:,} tokens of KV cache, more than --kv-capacity {limits.kv_capacity:,}; "
            "raise it or shrink the workload"
        )
    if export is not None:
        with open(export, "w", encoding="utf-8") as handle:
            count = write_trace(workload.requests(), handle, step_seconds)
        out.write(f"wrote {count:,} requests to {export} ({step_seconds:g} s per step)\n")
        return None

    description = workload.describe()
    _, default_size = limits.encoder_budget(workload.max_embeds_per_item())
    report = Report(
        description, limits, cost, bytes_per_embed, basis, default_size, behaviour=args.behaviour is not None
    )
    sweep = not args.no_sweep and args.behaviour is None
    explicit = args.cache_sizes is not None
    sizes: list[int | None] = [
        None if s == default_size else s for s in (args.cache_sizes if explicit else DEFAULT_SIZES)
    ]
    # Runs: the headline variants, then the sweep, then an unbounded cache.
    total = len(variants) + (len(variants) * len(sizes) if explicit else 2 * len(sizes)) + 1 if sweep else len(variants)
    bar = None
    if not args.no_progress and err.isatty():
        bar = Progress(total * workload.num_requests, err)
    runner = _Runner(workload, limits, cost, args.check, jobs, bar)
    try:
        if sweep and explicit:
            wanted = [(v, None) for v in variants] + [(v, s) for s in sizes for v in variants]
            wanted.append((Variant(), UNBOUNDED))
            runs = runner.run(wanted)
            report.headline = runs[: len(variants)]
            report.sweep = runs[len(variants) : -1]
            report.unbounded = runs[-1]
        else:
            extra = [(Variant(), UNBOUNDED)] if sweep else []
            runs = runner.run([(v, None) for v in variants] + extra)
            report.headline = runs[: len(variants)]
            if sweep:
                report.unbounded = runs[-1]
                best = report.best()
                chosen = list(
                    dict.fromkeys(r.variant for r in (report.baseline(report.headline), best) if r is not None)
                )
                report.sweep = runner.run([(v, s) for s in sizes for v in chosen])
                # Not within reach yet: go on by 4x while a larger cache could still hold more.
                largest = DEFAULT_SIZES[-1]
                needed = report.unbounded.counters.distinct_embeds
                for _ in range(MAX_EXTRA_SIZES):
                    rec = report.recommendation()
                    if rec is None or rec["found"] or largest >= needed:
                        break
                    largest *= 4
                    if bar is not None:
                        bar.total += len(chosen) * workload.num_requests
                    report.sweep += runner.run([(v, largest) for v in chosen])
                # One finer size between the last one too small and the first one within reach.
                rec = report.recommendation()
                known = report.sizes()
                if rec is not None and rec["found"] and known.index(rec["size"]) > 0:
                    below = known[known.index(rec["size"]) - 1]
                    middle = round((below * rec["size"]) ** 0.5 / 1024) * 1024
                    if below < middle < rec["size"]:
                        if bar is not None:
                            bar.total += len(chosen) * workload.num_requests
                        report.sweep += runner.run([(v, middle) for v in chosen])
    except ValueError as exc:
        raise UsageError(_flagged(str(exc))) from None
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
    return 0
