"""Instructions per call, counted by callgrind: the repeatable complement to the
pytest-benchmark timings on a noisy machine.

    python benches/instructions.py          # needs valgrind; a few minutes

Each case runs under ``valgrind --tool=callgrind`` twice, doing its work N times
and 0 times; the difference over N is the count per call (per item for the
request cases), startup and setup cancelled out. The cases and stand-ins are
the benches' own (bench_calls, bench_lifecycle); the chunked-prefill case
uses the step-level methods, which the floor and reads stand-ins lack.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from bench_lifecycle import FRAME_SIZE, NUM_FRAMES, Rounds, chunked_prefill, lifecycle, long_video
from workloads import BUDGET, CACHE_SIZE, FLOORS, MANAGERS, floor, make_request, schedule

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
CALL_REPEATS = 20_000
IMPLEMENTATIONS = [*MANAGERS, *FLOORS]


def release_reacquire(manager, req):
    manager.free_encoder_input(req, INPUT)
    return manager.check_and_update_cache(req, INPUT)


def work(case: str, impl: str, n: int, built: int) -> None:
    """Do the case's work n times (the child side, under valgrind); a request
    case builds ``built`` requests either way, so only the work differs."""
    if case in CALL_CASES:
        req = make_request("req-warm", 8)
        manager = floor(impl) if impl in FLOORS else MANAGERS[impl](CACHE_SIZE)
        if impl in MANAGERS:
            schedule(manager, req)
        function, args = CALL_CASES[case](manager, req)
        for _ in range(n):
            function(*args)
        return
    items, size, _, one_round = REQUEST_CASES[case]
    rounds = Rounds(impl, items, size)
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
    if case == CHUNKED_VIDEO and impl in FLOORS:
        return None
    if case in CALL_CASES:
        n, units = CALL_REPEATS, CALL_REPEATS
    else:
        items, _, n, _ = REQUEST_CASES[case]
        units = n * items
    return (count(case, impl, n, 2 + n) - count(case, impl, 0, 2 + n)) / units


def main() -> None:
    print("| case | Python | Rust | Python / Rust | floor | reads | Rust / reads | Python / reads |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in [*CALL_CASES, *REQUEST_CASES]:
        py, rs, fl, rd = (per_unit(case, impl) for impl in IMPLEMENTATIONS)
        cells = [f"{py:,.0f}", f"{rs:,.0f}", f"{py / rs:.1f}x"]
        if rd is not None:
            cells += [f"{fl:,.0f}", f"{rd:,.0f}", f"{rs / rd:.1f}x", f"{py / rd:.1f}x"]
        print(f"| {case} | " + " | ".join(cells + [""] * (7 - len(cells))) + " |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5:
        work(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
