"""The command line's options: their parsers (argparse reports a bad value
naming the flag), the option groups, and the options generated from the
configs' fields (``WorkloadConfig``, ``SchedulerLimits``)."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import MISSING, fields
from typing import Any

from encoder_cache.simulator.cost import DEFAULT_PER_EMBED_SQ_US, DEFAULT_PER_EMBED_US
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.workloads import WorkloadConfig

__all__ = [
    "DEFAULT_SIZES",
    "DEFAULT_STEP_SECONDS",
    "DTYPE_BYTES",
    "FLAGS",
    "MAX_EXTRA_SIZES",
    "PLOT_FORMATS",
    "add_arguments",
    "flagged",
    "given",
]

#: The sizes a sweep tries when none are given: vLLM's defaults (2,048 on
#: smaller GPUs, 8,192 for `vllm serve` on H100-class ones) and 4x, 16x more.
DEFAULT_SIZES = (2048, 8192, 32768, 131072)
#: How many more sizes (each 4x the last) the default sweep tries to get within 5% of unbounded.
MAX_EXTRA_SIZES = 3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "webp")
DEFAULT_STEP_SECONDS = 0.05


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
FLAGS: dict[str, str] = {}


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
        FLAGS[f.name] = flag
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


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if f.metadata.get("cli") is not False and getattr(args, f.name) is not None
    }


def flagged(message: str) -> str:
    """A config's message with its field names replaced by the flags that set them."""
    for name in sorted(FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", FLAGS[name], message)
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
    scheduler.add_argument(
        "--no-async-scheduling",
        action="store_true",
        help="schedule each step after the previous one's output came back (vLLM's --no-async-scheduling); "
        "by default the next step is scheduled first, as vllm serve does",
    )
    scheduler.add_argument(
        "--no-scheduler-reserve-full-isl",
        action="store_true",
        help="admit a waiting request when its first chunk fits in free KV blocks (vLLM's "
        "--no-scheduler-reserve-full-isl); by default its whole prompt must fit",
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        choices=("model", "vllm"),
        default="model",
        help="model: the built-in scheduler model (fast, no vLLM needed); vllm: replay through vLLM 0.33's "
        "own scheduler on CPU (needs vLLM installed; no GPU, no weights) (default: model)",
    )
