"""Memory: bytes per live request and per cached entry, for 100,000 of each.

100k requests each allocate one distinct item: bytes per live request (the
request's bookkeeping and its held entry) = bytes / 100k. Then every request is
freed, and the entries stay cached, unreferenced, until space is needed: bytes
per cached entry = bytes / 100k.

How bytes are counted (the requests themselves are built before counting and
are not included):
- vllm (vLLM 0.33.0's module) and python (the twin): tracemalloc, every
  allocation the manager's dicts, sets and ints make;
- rust: glibc's malloc statistics (mallinfo2: bytes in use, heap and mmap),
  every allocation the Rust manager makes, chunk overhead included.
tracemalloc counts requested sizes without pymalloc's rounding, so the Python
figures are, if anything, slightly low.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import tracemalloc

import pytest
from workloads import CACHE_SIZE, MANAGERS, make_request

NUM = 100_000


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc_mallinfo2():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    return mallinfo2


MALLINFO2 = _glibc_mallinfo2()


def malloc_in_use() -> int:
    info = MALLINFO2()
    return info.uordblks + info.hblkhd


def python_heap() -> int:
    return tracemalloc.get_traced_memory()[0]


def measure(impl: str, requests: list) -> dict[str, float]:
    manager = MANAGERS[impl](CACHE_SIZE)
    counted = malloc_in_use if impl == "rust" else python_heap
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
    if impl == "rust" and MALLINFO2 is None:
        pytest.skip("counting the Rust manager's memory needs glibc's mallinfo2")
    requests = [make_request(f"req-{n}", 1, first_item=n) for n in range(NUM)]
    if impl != "rust":
        tracemalloc.start()
    try:
        result = benchmark.pedantic(measure, args=(impl, requests), rounds=1, iterations=1)
    finally:
        tracemalloc.stop()
    benchmark.extra_info.update(result)
    assert 0 < result["bytes_per_entry"] < 2_000
    assert 0 < result["bytes_per_live_request"] < 2_000
