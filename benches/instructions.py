"""Instructions per call, counted by callgrind: the repeatable complement to the
pytest-benchmark timings on a noisy machine.

    python benches/instructions.py [case ...]   # needs valgrind and a C compiler; a few minutes

One ``valgrind --tool=callgrind`` process per implementation runs every case:
it sets the case up, zeroes callgrind's counters, does the work N times and
dumps the counters (through callgrind's client requests, from a small C helper
compiled on the fly), so setup is never counted. The count per call (per item
for the request cases, per step for the step cases) is the dump's total over N,
less the same loop doing nothing. The cases and stand-ins are the benches' own
(bench_calls, bench_lifecycle, bench_step); the step-level cases have no floor
or reads stand-ins. ``gdsf``, ``s3fifo``, ``lfu-ghost``, ``arc`` and ``duel`` are the Rust manager under those
policies.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from bench_lifecycle import FRAME_SIZE, NUM_FRAMES, Rounds, chunked_prefill, lifecycle, long_video
from bench_step import BUDGET as STEP_BUDGET
from bench_step import cached_request
from workloads import BUDGET, CACHE_SIZE, FLOORS, MANAGERS, STEP_MANAGERS, floor, make_request, schedule

import encoder_cache

INPUT = 3
# Each case gives (function, args), called as pytest-benchmark calls it.
CALL_CASES = {
    "check_and_update_cache (hit)": lambda m, r: (m.check_and_update_cache, (r, INPUT)),
    "can_allocate (fits)": lambda m, r: (m.can_allocate, (r, INPUT, BUDGET, 0)),
    "get_cached_num_encoder_embeds": lambda m, r: (m.get_cached_num_encoder_embeds, (r, INPUT)),
    "get_cached_input_ids": lambda m, r: (m.get_cached_input_ids, (r,)),
    "free_encoder_input + check_and_update_cache": lambda m, r: (release_reacquire, (m, r)),
}
#: Through the step-level methods, which the floor and reads stand-ins lack.
CHUNKED_VIDEO = "long video, chunked prefill, per frame"
# Each gives (items, embeddings per item, rounds counted, one round of the bench).
REQUEST_CASES = {
    "lifecycle, per item": (64, 64, 20, lifecycle),
    "long video, per frame": (NUM_FRAMES, FRAME_SIZE, 1, long_video),
    CHUNKED_VIDEO: (NUM_FRAMES, FRAME_SIZE, 1, chunked_prefill),
}
#: One step-level call for a request whose items are all cached and held, per step.
STEP_CASES = {"step: schedule 1 cached item": 1, "step: schedule 16 cached items": 16}
CALL_REPEATS = 5_000
POLICIES = {name: partial(encoder_cache.EncoderCacheManager, policy=name) for name in encoder_cache.POLICIES[1:]}
ALL_MANAGERS = {**MANAGERS, **POLICIES}
IMPLEMENTATIONS = ["vllm", "rust", *FLOORS, *POLICIES]
MARKS_C = """
#include <valgrind/callgrind.h>
void zero(void) { CALLGRIND_ZERO_STATS; }
void dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


def release_reacquire(manager, req):
    manager.free_encoder_input(req, INPUT)
    return manager.check_and_update_cache(req, INPUT)


def applies(case: str, impl: str) -> bool:
    return not ((case == CHUNKED_VIDEO or case in STEP_CASES) and impl in FLOORS)


def prepare(case: str, impl: str):
    """(function, args, units per call, calls) for the case, set up and warm."""
    if case in STEP_CASES:
        cls = STEP_MANAGERS[impl] if impl in STEP_MANAGERS else POLICIES[impl]
        manager, req, window = cached_request(STEP_CASES[case], cls)
        args = (req, 0, window, STEP_BUDGET)
        return manager.try_schedule_encoder_inputs, args, 1, CALL_REPEATS
    if case in CALL_CASES:
        req = make_request("req-warm", 8)
        manager = floor(impl) if impl in FLOORS else ALL_MANAGERS[impl](CACHE_SIZE)
        if impl not in FLOORS:
            schedule(manager, req)
        function, args = CALL_CASES[case](manager, req)
        return function, args, 1, CALL_REPEATS
    items, size, n, one_round = REQUEST_CASES[case]
    managers = {**STEP_MANAGERS, **POLICIES} if case == CHUNKED_VIDEO else ALL_MANAGERS
    rounds = Rounds(impl, items, size, managers=managers)
    requests = [rounds.next_request() for _ in range(2 + n)]
    for req in requests[:2]:  # two warm-up rounds fill the cache, as in the benches
        one_round(rounds.manager, req)
    pending = iter(requests[2:])
    return lambda: one_round(rounds.manager, next(pending)), (), items, n


def child(impl: str, cases: list[str], marks_path: str) -> None:
    """Under valgrind: each case's work between a zero and a dump of the counters."""
    marks = ctypes.CDLL(marks_path)
    for case in ["(loop)", *cases]:
        if case != "(loop)" and not applies(case, impl):
            continue
        if case == "(loop)":  # the bare loop, less from every case
            marks.zero()
            for _ in range(CALL_REPEATS):
                pass
            marks.dump(case.encode())
            continue
        function, args, _, calls = prepare(case, impl)
        marks.zero()
        for _ in range(calls):
            function(*args)
        marks.dump(case.encode())


def counts(impl: str, cases: list[str], marks_path: str, out_dir: str) -> dict[str, int]:
    """Instructions per case for ``impl``, loop included."""
    out = os.path.join(out_dir, f"{impl}.out")
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            impl,
            marks_path,
            *cases,
        ],
        capture_output=True,
        check=True,
        # A fixed hash seed: string hashing decides dict layouts, and so a few hundred instructions per item.
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = {}
    for dump in Path(out_dir).glob(f"{impl}.out*"):
        text = dump.read_text()
        trigger = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if trigger and total:
            found[trigger.group(1)] = int(total.group(1))
    return found


def main(cases: list[str]) -> None:
    with tempfile.TemporaryDirectory() as out_dir:
        marks = Path(out_dir) / "marks.so"
        source = Path(out_dir) / "marks.c"
        source.write_text(MARKS_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(marks), str(source)], check=True)
        per_impl = {impl: counts(impl, cases, str(marks), out_dir) for impl in IMPLEMENTATIONS}
    print(
        "| case | vLLM | Rust | vLLM / Rust | floor | Rust / floor | reads | "
        + " | ".join(f"{p} / Rust" for p in POLICIES)
        + " |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in POLICIES) + " |")
    for case in cases:
        per_unit = {}
        for impl, found in per_impl.items():
            if case in found:
                units, calls = unit_calls(case)
                per_unit[impl] = (found[case] - found["(loop)"] * calls / CALL_REPEATS) / (calls * units)
        vl, rs, fl, rd = per_unit["vllm"], per_unit["rust"], per_unit.get("floor"), per_unit.get("reads")
        cells = [f"{vl:,.0f}", f"{rs:,.0f}", f"{vl / rs:.2f}x"]
        cells += [f"{fl:,.0f}", f"{rs / fl:.2f}x", f"{rd:,.0f}"] if fl is not None else ["", "", ""]
        cells += [f"{per_unit[p] / rs:.2f}x" for p in POLICIES]
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


def unit_calls(case: str) -> tuple[int, int]:
    """(units per call, calls) of a case."""
    if case in REQUEST_CASES:
        items, _, n, _ = REQUEST_CASES[case]
        return items, n
    return 1, CALL_REPEATS


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:], sys.argv[3])
    else:
        main(sys.argv[1:] or [*CALL_CASES, *REQUEST_CASES, *STEP_CASES])
