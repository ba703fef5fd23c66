"""``python -m encoder_cache simulate``: replay a workload through each chosen
manager variant and print what the encoder computed and what the bookkeeping cost."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import MISSING, fields
from typing import Any, TextIO

from encoder_cache.simulator import report
from encoder_cache.simulator.scheduler import (
    BEHAVIOURS,
    IMPLEMENTATIONS,
    MANAGERS,
    RunResult,
    SchedulerLimits,
    SimulationError,
    simulate,
)
from encoder_cache.simulator.workloads import WorkloadConfig, generate

__all__ = ["add_arguments", "main", "run"]


class UsageError(Exception):
    """A bad option value: reported in one line, exit code 2."""


def _range(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 2
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX or N, got {text!r}")
    return values[0], values[1]


def _weights(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(p) for p in text.split(":"))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected CHAT:VIDEO:POPULAR weights, got {text!r}")
    return values  # type: ignore[return-value]


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, got {text!r}")
        return list(dict.fromkeys(names))

    return parse


# Annotations are strings (postponed evaluation); each maps to its parser.
_PARSERS = {
    "str": str,
    "int": int,
    "int | None": int,
    "float": float,
    "float | None": float,
    "Range": _range,
    "tuple[float, float, float]": _weights,
}


def _config_options(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    group = parser.add_argument_group(title)
    for f in fields(cls):
        meta = f.metadata
        default = f.default if f.default is not MISSING else None
        shown = ":".join(f"{v:g}" for v in default) if isinstance(default, tuple) else default
        metavar = meta.get("metavar") or ("MIN:MAX" if f.type == "Range" else None)
        help = meta["help"] + (f" (default: {shown})" if shown is not None else "")
        group.add_argument(
            meta.get("flag") or "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_PARSERS[f.type],
            default=None,  # unset options leave the config's own default
            choices=meta.get("choices"),
            metavar=metavar,
            help=help,
        )


def _given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name) is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--impl",
        type=_names(IMPLEMENTATIONS),
        default=list(IMPLEMENTATIONS),
        metavar="LIST",
        help="implementations to run: rust, python (default: rust,python)",
    )
    parser.add_argument(
        "--behaviour",
        type=_names(BEHAVIOURS),
        default=["fixed", "prefix"],
        metavar="LIST",
        help="manager behaviours: fixed (vLLM 0.33), prefix (before the fix), scan (the fix as the PR "
        "first wrote it) (default: fixed,prefix). Rust implements only fixed: its pairs with the "
        "others are skipped",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plot", metavar="PATH", help="also write a PNG comparing the variants (needs matplotlib)")
    parser.add_argument("--check", action="store_true", help="verify the cache's accounting after every step (slow)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _config_options(parser, WorkloadConfig, "workload")
    _config_options(parser, SchedulerLimits, "scheduler")


def _variants(implementations: list[str], behaviours: list[str]) -> list[tuple[str, str]]:
    chosen = [(i, b) for i in implementations for b in behaviours if (i, b) in MANAGERS]
    for i in implementations:
        if not any(v[0] == i for v in chosen):
            raise UsageError(f"--impl {i} has no variant with --behaviour {','.join(behaviours)}; rust is fixed only")
    for b in behaviours:
        if not any(v[1] == b for v in chosen):
            raise UsageError(
                f"--behaviour {b} has no variant with --impl {','.join(implementations)}; add --impl python"
            )
    return chosen


class Progress:
    """A one-line progress bar on a terminal, shown once the runs have taken
    ``delay`` seconds and redrawn at most every ``interval`` seconds."""

    def __init__(self, total: int, stream: TextIO, delay: float = 2.0, interval: float = 0.1) -> None:
        self.total, self.stream, self.interval = total, stream, interval
        self.drawn = time.monotonic() + delay - interval  # the first draw comes after ``delay``
        self.shown = False
        self.done = 0  # requests of the variants already run
        self.label = ""

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.drawn < self.interval:
            return
        self.drawn = now
        self.shown = True
        fraction = min((self.done + done) / self.total, 1.0)
        bar = "#" * int(30 * fraction)
        self.stream.write(f"\r[{bar:<30}] {fraction:4.0%} {self.label}")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> list[RunResult]:
    """Run the simulation ``args`` describe; the report goes to ``out`` (stdout),
    the progress bar to ``err`` (stderr) when it is a terminal."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        config = WorkloadConfig(**_given(args, WorkloadConfig))
        limits = SchedulerLimits(**_given(args, SchedulerLimits))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants = _variants(args.impl, args.behaviour)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'encoder-cache[plot]'") from None
        directory = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(directory):
            raise UsageError(f"--plot: no directory {directory!r}")
    workload = generate(config)
    bar = None
    if not args.no_progress and err.isatty():
        bar = Progress(workload.num_requests * len(variants), err)
    results = []
    try:
        for implementation, behaviour in variants:
            if bar is not None:
                bar.label = f"{implementation}-{behaviour}"
            try:
                results.append(
                    simulate(
                        workload,
                        limits,
                        implementation,
                        behaviour,
                        check=args.check,
                        progress=None if bar is None else bar.update,
                    )
                )
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            if bar is not None:
                bar.done += workload.num_requests
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        json.dump(report.to_json(config, limits, results), out, indent=2)
        out.write("\n")
    else:
        out.write(report.format_table(config, limits, results) + "\n")
    if args.plot is not None:
        report.plot(config, limits, results, args.plot)
        if not args.json:
            out.write(f"plot written to {args.plot}\n")
    return results


def main(args: argparse.Namespace) -> int:
    """Run, turning bad values into one line on stderr and exit code 2."""
    try:
        run(args)
    except UsageError as exc:
        print(f"encoder_cache simulate: error: {exc}", file=sys.stderr)
        return 2
    except SimulationError as exc:
        print(f"encoder_cache simulate: simulation failed: {exc}", file=sys.stderr)
        return 1
    return 0
