"""Memory: bytes per live request and per cached entry, for 100,000 of each.

100k requests each allocate one distinct item: bytes per live request (the
request's bookkeeping and its held entry) = bytes / 100k. Then every request is
freed, and the entries stay cached, unreferenced, until space is needed: bytes
per cached entry = bytes / 100k.

How bytes are counted (the requests themselves are built before counting and
are not included):
- vllm (vLLM 0.33.0's module) and python (the twin): tracemalloc, every
  allocation the manager's dicts, sets and ints make;
- rust: the growth of the process's resident memory (Linux's
  /proc/self/statm), in a child process of its own. The extension allocates
  with mimalloc, which glibc's statistics do not see; the child runs with
  MIMALLOC_PURGE_DELAY=0, so pages the frees empty go back to the system at
  once. Resident memory counts whole pages, allocator overhead included.
tracemalloc counts requested sizes without pymalloc's rounding, so the Python
figures are, if anything, slightly low.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from workloads import CACHE_SIZE, MANAGERS, make_request

NUM = 100_000
BENCHES = Path(__file__).parent


#: The Rust manager's count, run in a child process (see the module's doc).
RSS_CHILD = """
import json
from bench_memory import NUM, measure, resident
from workloads import make_request

requests = [make_request(f"req-{n}", 1, first_item=n) for n in range(NUM)]
print(json.dumps(measure("rust", requests, resident)))
"""


def resident() -> int:
    """The process's resident memory, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_rust() -> dict[str, float]:
    env = {
        **os.environ,
        "MIMALLOC_PURGE_DELAY": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCHES), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run([sys.executable, "-c", RSS_CHILD], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def python_heap() -> int:
    return tracemalloc.get_traced_memory()[0]


def measure(impl: str, requests: list, counted) -> dict[str, float]:
    manager = MANAGERS[impl](CACHE_SIZE)
    gc.collect()
    start = counted()
    for req in requests:
        manager.allocate(req, 0)
    live = counted() - start
    for req in requests:
        manager.free(req)
    gc.collect()
    entries = counted() - start
    assert len(manager.freeable) == NUM
    return {"bytes_per_live_request": live / NUM, "bytes_per_entry": entries / NUM}


@pytest.mark.benchmark(group="memory: 100k entries (time is the build, counting included)")
@pytest.mark.parametrize("impl", list(MANAGERS))
def bench_memory(benchmark, impl):
    if impl == "rust":
        if not os.path.exists("/proc/self/statm"):
            pytest.skip("counting the Rust manager's memory reads Linux's /proc/self/statm")
        result = benchmark.pedantic(measure_rust, rounds=1, iterations=1)
    else:
        requests = [make_request(f"req-{n}", 1, first_item=n) for n in range(NUM)]
        tracemalloc.start()
        try:
            result = benchmark.pedantic(measure, args=(impl, requests, python_heap), rounds=1, iterations=1)
        finally:
            tracemalloc.stop()
    benchmark.extra_info.update(result)
    assert 0 < result["bytes_per_entry"] < 2_000
    assert 0 < result["bytes_per_live_request"] < 2_000
