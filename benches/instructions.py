"""Instructions per call, counted by callgrind: the repeatable complement to the
pytest-benchmark timings on a noisy machine.

    python benches/instructions.py          # needs valgrind; a few minutes

Each case runs under ``valgrind --tool=callgrind`` twice, doing its work N times
and 0 times; the difference over N is the count per call (per item for the
request cases, per step for the step cases), startup and setup cancelled out.
The cases and stand-ins are the benches' own (bench_calls, bench_lifecycle,
bench_step); the step-level cases have no floor or reads stand-ins. ``gdsf``
and ``s3fifo`` are the Rust manager under those policies.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from functools import partial

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
POLICIES = {name: partial(encoder_cache.EncoderCacheManager, policy=name) for name in ("gdsf", "s3fifo")}
ALL_MANAGERS = {**MANAGERS, **POLICIES}
IMPLEMENTATIONS = ["vllm", "rust", *FLOORS, *POLICIES]


def release_reacquire(manager, req):
    manager.free_encoder_input(req, INPUT)
    return manager.check_and_update_cache(req, INPUT)


def work(case: str, impl: str, n: int, built: int) -> None:
    """Do the case's work n times (the child side, under valgrind); a request
    case builds ``built`` requests either way, so only the work differs."""
    if case in STEP_CASES:
        cls = STEP_MANAGERS[impl] if impl in STEP_MANAGERS else POLICIES[impl]
        manager, req, window = cached_request(STEP_CASES[case], cls)
        for _ in range(n):
            manager.try_schedule_encoder_inputs(req, 0, window, STEP_BUDGET)
        return
    if case in CALL_CASES:
        req = make_request("req-warm", 8)
        manager = floor(impl) if impl in FLOORS else ALL_MANAGERS[impl](CACHE_SIZE)
        if impl not in FLOORS:
            schedule(manager, req)
        function, args = CALL_CASES[case](manager, req)
        for _ in range(n):
            function(*args)
        return
    items, size, _, one_round = REQUEST_CASES[case]
    rounds = Rounds(impl, items, size, managers=ALL_MANAGERS if case != CHUNKED_VIDEO else {**STEP_MANAGERS, **POLICIES})
    requests = [rounds.next_request() for _ in range(built)]
    for req in requests[: 2 + n]:  # two warm-up rounds fill the cache, as in the benches
        one_round(rounds.manager, req)


def count(case: str, impl: str, n: int, built: int) -> int:
    command = [sys.executable, __file__, case, impl, str(n), str(built)]
    # A fixed hash seed: string hashing decides dict layouts, and so a few hundred instructions per item.
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    ).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def per_unit(case: str, impl: str) -> float | None:
    if (case == CHUNKED_VIDEO or case in STEP_CASES) and impl in FLOORS:
        return None
    if case in CALL_CASES or case in STEP_CASES:
        n, units = CALL_REPEATS, CALL_REPEATS
    else:
        items, _, n, _ = REQUEST_CASES[case]
        units = n * items
    return (count(case, impl, n, 2 + n) - count(case, impl, 0, 2 + n)) / units


def main() -> None:
    cases = sys.argv[1:] or [*CALL_CASES, *REQUEST_CASES, *STEP_CASES]
    print("| case | vLLM | Rust | vLLM / Rust | floor | Rust / floor | reads | gdsf / Rust | s3fifo / Rust |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in cases:
        counts = {impl: per_unit(case, impl) for impl in IMPLEMENTATIONS}
        vl, rs, fl, rd = counts["vllm"], counts["rust"], counts.get("floor"), counts.get("reads")
        cells = [f"{vl:,.0f}", f"{rs:,.0f}", f"{vl / rs:.2f}x"]
        cells += [f"{fl:,.0f}", f"{rs / fl:.2f}x", f"{rd:,.0f}"] if fl is not None else ["", "", ""]
        cells += [f"{counts[p] / rs:.2f}x" for p in POLICIES]
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[3].isdigit():
        work(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
