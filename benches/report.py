"""Turn a pytest-benchmark JSON file into the tables of BENCHMARKS.md.

    python benches/report.py .benchmarks/latest.json

Times are medians over the rounds. Ratios compare implementations measured in
the same run. "floor" is the same calls into PyO3 methods that do nothing:
"Rust / floor" says how close a Rust call is to the cost of the crossing
itself, and "Python / floor" is the most any per-call manager could gain.
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
            groups[bench["group"]][bench["param"]] = bench
    return groups


def median(bench: dict) -> float:
    return bench["stats"]["median"]


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


def call_table(groups: dict[str, dict[str, dict]]) -> list[str]:
    lines = [
        "| case | Python | Rust | Python / Rust | floor | Rust / floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for group, benches in groups.items():
        py, rs, fl = (median(benches[k]) for k in ("python", "rust", "floor"))
        lines.append(
            f"| {group} | {fmt_time(py)} | {fmt_time(rs)} | {py / rs:.1f}x | {fmt_time(fl)} | {rs / fl:.1f}x |"
        )
    return lines


def request_table(groups: dict[str, dict[str, dict]]) -> list[str]:
    lines = [
        "| case | Python | Rust | Python / Rust | floor | Python / floor | any() scan | any() scan / Rust |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for group, benches in groups.items():
        py, rs, fl = (median(benches[k]) for k in ("python", "rust", "floor"))
        scan = benches.get("anyscan")
        scan_cells = f"{fmt_time(median(scan))} | {median(scan) / rs:,.0f}x" if scan else " | "
        lines.append(
            f"| {group} | {fmt_time(py)} | {fmt_time(rs)} | {py / rs:.1f}x "
            f"| {fmt_time(fl)} | {py / fl:.1f}x | {scan_cells} |"
        )
    return lines


def memory_table(groups: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| bytes | Python | Rust | Rust / Python |", "| --- | ---: | ---: | ---: |"]
    for benches in groups.values():
        if not {"python", "rust"} <= benches.keys():
            continue  # the Rust count needs glibc
        py, rs = benches["python"]["extra_info"], benches["rust"]["extra_info"]
        for key, label in (
            ("bytes_per_live_request", "per live request (holding one entry)"),
            ("bytes_per_entry", "per cached entry (unreferenced)"),
        ):
            lines.append(f"| {label} | {py[key]:,.0f} | {rs[key]:,.0f} | {rs[key] / py[key]:.2f} |")
    return lines


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    benchmarks = data["benchmarks"]
    sections = [
        ("Machine", machine(data)),
        ("Per call, warm cache (median)", call_table(by_group(benchmarks, "bench_calls"))),
        ("Per request (median per round)", request_table(by_group(benchmarks, "bench_lifecycle"))),
        ("Memory, 100k entries", memory_table(by_group(benchmarks, "bench_memory"))),
    ]
    for title, lines in sections:
        print(f"### {title}\n")
        print("\n".join(lines), end="\n\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
