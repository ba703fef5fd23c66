"""The command line's options: their parsers (argparse reports a bad value
naming the flag), the option groups, and the options generated from the
configs' fields (``WorkloadConfig``, ``SchedulerLimits``)."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import MISSING, dataclass, fields
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
    "Memory",
    "Sizes",
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


def _gib_list(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected GiB sizes > 0, such as 4,16,64, got {text!r}")
    return list(dict.fromkeys(values))


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


_UNITS = {
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Memory:
    """A cache size given in bytes (``512MiB``): embeddings once the bytes per embedding are known."""

    bytes: int

    def embeds(self, bytes_per_embed: int) -> int:
        return self.bytes // bytes_per_embed


def _size(text: str) -> int | Memory:
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(text)
    number, unit = match.groups()
    if unit is None:
        if "." in number:
            raise ValueError(text)
        return int(number)
    return Memory(int(float(number) * _UNITS[unit.lower()]))


def resolve(value: int | Memory, bytes_per_embed: int) -> int:
    return value.embeds(bytes_per_embed) if isinstance(value, Memory) else value


@dataclass(frozen=True)
class Sizes:
    """``--cache-sizes``: a list, or a range from MIN to MAX by FACTOR; in
    embeddings or in memory (``512MiB``, ``2GiB``), converted with the bytes per embedding."""

    values: tuple[int | Memory, ...] = ()
    lo: int | Memory | None = None
    hi: int | Memory | None = None
    factor: float = 2.0

    def embeds(self, bytes_per_embed: int) -> list[int]:
        if self.lo is None or self.hi is None:
            sizes = [resolve(v, bytes_per_embed) for v in self.values]
        else:
            lo, hi = resolve(self.lo, bytes_per_embed), resolve(self.hi, bytes_per_embed)
            if hi < lo:
                raise ValueError(f"MAX ({hi:,} embeddings) is below MIN ({lo:,} embeddings)")
            sizes, size = [], float(lo)
            while size <= hi * (1 + 1e-9) and len(sizes) < 64:
                sizes.append(round(size))
                size *= self.factor
        if not sizes or min(sizes) <= 0:
            raise ValueError(
                f"every size must hold at least one embedding ({bytes_per_embed:,} bytes), got {min(sizes, default=0)}"
            )
        return sorted(set(sizes))


def _sizes(text: str) -> Sizes:
    """``A,B,C`` or ``MIN:MAX`` (doubling from MIN up to MAX) or ``MIN:MAX:FACTOR``; each an
    embedding count or a memory size (``512MiB``, ``2GiB``, ``1.5GB``)."""
    expected = f"expected A,B,C or MIN:MAX[:FACTOR], each in embeddings or memory (512MiB, 2GiB), got {text!r}"
    if ":" in text:
        parts = text.split(":")
        try:
            lo, hi = _size(parts[0]), _size(parts[1])
            factor = _float(parts[2]) if len(parts) == 3 else 2.0
        except (ValueError, IndexError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(expected) from None
        same_units = isinstance(lo, Memory) == isinstance(hi, Memory)
        low, high = (lo.bytes, hi.bytes) if isinstance(lo, Memory) and isinstance(hi, Memory) else (lo, hi)
        if len(parts) > 3 or factor <= 1 or (same_units and (not 0 < low <= high)):  # type: ignore[operator]
            raise argparse.ArgumentTypeError(
                f"expected MIN:MAX[:FACTOR] with 0 < MIN <= MAX and FACTOR > 1, got {text!r}"
            )
        return Sizes(lo=lo, hi=hi, factor=factor)
    try:
        values = tuple(_size(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(expected) from None
    if not values or any((v.bytes if isinstance(v, Memory) else v) <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected sizes > 0, got {text!r}")
    return Sizes(values)


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
        help="encoder-cache sizes to show, each in embeddings or memory (512MiB, 2GiB: converted with "
        "--hidden-size and --dtype): A,B,C or MIN:MAX[:FACTOR] (doubling by default); every policy runs at each; "
        "the recommendation comes from its own search either way (default: a short sweep for vllm and the best "
        "policy, "
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
    host = parser.add_argument_group("host-memory tier (vLLM's ECCPUConnector, as encoder_cache's HostTierConnector)")
    host.add_argument(
        "--host-cache-gib",
        type=_gib_list,
        metavar="LIST",
        help="also run vLLM's default GPU encoder cache with a host tier of each of these sizes, in GiB "
        "(e.g. 4,16,64), and let the recommendation search host tiers too (default: no host tier)",
    )
    host.add_argument(
        "--host-policy",
        type=_names,
        metavar="LIST",
        help="the host tier's eviction policies to show, from encoder_cache.HOST_POLICIES "
        "(default: all; the recommendation tries all)",
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
    memory = parser.add_argument_group("memory (sizes in bytes, and --cache-sizes given in memory)")
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
        help="also draw encoded embeddings against cache size; the extension picks the format: "
        + ", ".join(PLOT_FORMATS)
        + " (default .png; needs matplotlib)",
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
    routing = parser.add_argument_group("routing across replicas (--replicas)")
    routing.add_argument(
        "--replicas",
        type=_int,
        metavar="N",
        help="instead of the policy comparison, run N replicas (each its own scheduler, KV cache and encoder "
        "cache) behind a router and compare the routing choices",
    )
    routing.add_argument(
        "--routing",
        type=_names,
        metavar="LIST",
        help="routing choices: round-robin, least-loaded, lru-guess (llm-d's router-side LRU of placed item "
        "hashes), cache-aware (the replicas' exact encoder-cache events), cache-aware+placed (those events plus "
        "the router's unfinished placements), cache-aware+kv (the exact events of both the encoder cache and "
        "the KV cache: the encoder work each replica would spare) (default: all)",
    )
    routing.add_argument(
        "--overload-slack",
        type=_int,
        metavar="N",
        help="the cache routers skip a replica with more than N requests above the least-loaded one (default: 8)",
    )
    routing.add_argument(
        "--guess-entries",
        type=_int,
        metavar="N",
        help="item hashes the LRU guess keeps per replica (default: 2048, llm-d's 4,096 MB per server at "
        "2 MiB per entry)",
    )
    routing.add_argument(
        "--no-sticky-sessions",
        action="store_true",
        help="route every session turn afresh (by default a session stays on the replica of its first request)",
    )
