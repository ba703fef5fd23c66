"""Turn a pytest-benchmark JSON file into the tables of BENCHMARKS.md.

    python benches/report.py .benchmarks/latest.json

Times are medians over the rounds; ratios are of the medians and, in brackets,
of the fastest rounds (the least disturbed on a shared machine). Every ratio
compares implementations measured in the same run. "vLLM" is vLLM 0.33.0's own
module (``vllm_baseline.py``; for the step-level cases its scheduler's per-item
loops over it), so "vLLM / Rust" is the headline; "twin" is the package's
pure-Python twin. "floor" is the same calls into PyO3 methods that do nothing,
so "Rust / floor" says how close a Rust call comes to the cost of the crossing
itself; "reads" are methods that only read from the request what vLLM's
manager reads on every call, so "vLLM / reads" is the most a manager that
reads as vLLM's does could gain.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections import defaultdict


def fmt_time(seconds: float) -> str:
    ns = seconds * 1e9
    if ns < 10_000:
        return f"{ns:,.0f} ns"
    if ns < 10_000_000:
        return f"{ns / 1e3:,.1f} µs"
    return f"{ns / 1e6:,.1f} ms"


def by_group(benchmarks: list[dict], module: str) -> dict[str, dict[str, dict]]:
    """{group: {implementation: benchmark}} for the benches of ``benches/<module>.py``."""
    groups: dict[str, dict[str, dict]] = defaultdict(dict)
    for bench in benchmarks:
        if bench["fullname"].split("::")[0].endswith(f"{module}.py"):
            groups[bench["group"]][(bench.get("params") or {}).get("impl", bench["param"])] = bench
    return groups


def median(bench: dict) -> float:
    return bench["stats"]["median"]


def ratio(slow: dict, fast: dict) -> str:
    """slow / fast, of the medians and (in brackets) of the fastest rounds."""
    by_min = slow["stats"]["min"] / fast["stats"]["min"]
    return f"{median(slow) / median(fast):,.1f}x ({by_min:,.1f}x)"


def machine(data: dict) -> list[str]:
    info = data["machine_info"]
    try:
        rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rustc = "rustc: not found"
    cpu = info.get("cpu", {})
    return [
        f"- CPU: {cpu.get('brand_raw', '?')}, {cpu.get('count', '?')} logical cores",
        f"- {info.get('python_implementation', 'Python')} {info.get('python_version', '?')}, {rustc}",
        f"- {platform.system()} {info.get('release', '')}; run at {data.get('datetime', '?')}",
    ]


def time_of(impl: str):
    return lambda b: fmt_time(median(b[impl])) if impl in b else ""


def ratio_of(slow: str, fast: str):
    return lambda b: ratio(b[slow], b[fast]) if slow in b and fast in b else ""


#: The columns of the timing tables: (header, cell of a group's benchmarks).
BASE_COLUMNS = [
    ("vLLM", time_of("vllm")),
    ("Rust", time_of("rust")),
    ("vLLM / Rust", ratio_of("vllm", "rust")),
    ("twin", time_of("python")),
    ("twin / Rust", ratio_of("python", "rust")),
]
CALL_COLUMNS = [
    *BASE_COLUMNS,
    ("floor", time_of("floor")),
    ("Rust / floor", ratio_of("rust", "floor")),
    ("reads", time_of("reads")),
    ("vLLM / reads", ratio_of("vllm", "reads")),
]
REQUEST_COLUMNS = [
    *BASE_COLUMNS,
    ("floor", time_of("floor")),
    ("reads", time_of("reads")),
    ("any() scan", time_of("anyscan")),
    ("any() scan / Rust", ratio_of("anyscan", "rust")),
]
#: The host tier's block cache: vLLM's EmbeddingCache against ours under each policy.
HOST_COLUMNS = [
    ("vLLM", time_of("vllm")),
    ("fifo", time_of("fifo")),
    ("vLLM / fifo", ratio_of("vllm", "fifo")),
    ("gdsf", time_of("gdsf")),
    ("s3fifo", time_of("s3fifo")),
]


def timing_table(groups: dict[str, dict[str, dict]], columns) -> list[str]:
    lines = [
        "| case | " + " | ".join(header for header, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for group, benches in groups.items():
        lines.append(f"| {group} | " + " | ".join(cell(benches) for _, cell in columns) + " |")
    return lines


def memory_table(groups: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| bytes | vLLM | twin | Rust | Rust / vLLM |", "| --- | ---: | ---: | ---: | ---: |"]
    for benches in groups.values():
        if "rust" not in benches:
            continue  # the Rust count needs glibc
        info = {impl: bench["extra_info"] for impl, bench in benches.items()}
        rs = info["rust"]
        for key, label in (
            ("bytes_per_live_request", "per live request (holding one entry)"),
            ("bytes_per_entry", "per cached entry (unreferenced)"),
        ):
            cells = [f"{info[impl][key]:,.0f}" if impl in info else "" for impl in ("vllm", "python", "rust")]
            vs = f"{rs[key] / info['vllm'][key]:.2f}" if "vllm" in info else ""
            lines.append(f"| {label} | " + " | ".join([*cells, vs]) + " |")
    return lines


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    benchmarks = data["benchmarks"]
    sections = [
        ("Machine", machine(data)),
        ("Per call, warm cache", timing_table(by_group(benchmarks, "bench_calls"), CALL_COLUMNS)),
        ("Per request (time per round)", timing_table(by_group(benchmarks, "bench_lifecycle"), REQUEST_COLUMNS)),
        ("Step-level, one request, all items cached", timing_table(by_group(benchmarks, "bench_step"), BASE_COLUMNS)),
        ("Memory, 100k entries", memory_table(by_group(benchmarks, "bench_memory"))),
        ("Host tier, per operation", timing_table(by_group(benchmarks, "bench_host_tier"), HOST_COLUMNS)),
    ]
    for title, lines in sections:
        print(f"### {title}\n")
        print("\n".join(lines), end="\n\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
