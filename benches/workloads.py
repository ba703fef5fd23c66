"""What the benches share: the implementations under test and vLLM-shaped requests.

Every case runs each implementation on identical work in the same pytest run,
so the ratios hold on a noisy machine. ``benches/report.py`` turns the
pytest-benchmark JSON into the tables of BENCHMARKS.md.

The implementations: ``vllm``, vLLM 0.33.0's own module (the primary baseline,
see ``vllm_baseline.py``; its cases skip, saying why, when it is not cached),
``python``, the package's pure-Python twin (``encoder_cache.reference``, which
validates its inputs and so is slower than vLLM's code), and ``rust``.
"""

from __future__ import annotations

import hashlib

import pytest
import vllm_baseline

import encoder_cache
from encoder_cache import _core, reference
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request


def vllm_manager(cache_size: int):
    """vLLM 0.33.0's own manager; skips the calling test when it cannot be had."""
    try:
        cls = vllm_baseline.manager_class()
    except vllm_baseline.Unavailable as exc:
        pytest.skip(f"vLLM baseline: {exc}")
    return cls(cache_size)


def vllm_step_manager(cache_size: int):
    """vLLM's manager under its scheduler's per-item loops (step-level method names)."""
    return vllm_baseline.SchedulerLoops(vllm_manager(cache_size))


#: The managers compared, by constructor: vLLM 0.33.0's, the pure-Python twin, the Rust one.
MANAGERS = {
    "vllm": vllm_manager,
    "python": reference.EncoderCacheManager,
    "rust": encoder_cache.EncoderCacheManager,
}
#: The same, with the step-level methods (vLLM's: its scheduler's per-item loops over its manager).
STEP_MANAGERS = {**MANAGERS, "vllm": vllm_step_manager}

#: Room for every item a bench allocates, so nothing is evicted unless a case wants it.
CACHE_SIZE = 1 << 40
BUDGET = 1 << 40


def mm_hash(n: int) -> str:
    """An identifier shaped like vLLM's: 64 hex digits."""
    return hashlib.sha256(f"item-{n}".encode()).hexdigest()


def make_request(request_id: str, num_items: int, size: int = 64, first_item: int = 0) -> Request:
    """A request with ``num_items`` distinct items of ``size`` embeddings, one after another."""
    features = [
        MultiModalFeature(mm_hash(first_item + i), PlaceholderRange(i * (size + 1), size)) for i in range(num_items)
    ]
    return Request(request_id, features)


def schedule(manager, request: Request) -> None:
    """Give every item of the request a place in the cache, as vLLM's scheduler
    does per item: take a hit if there is one, else make room and allocate."""
    for i in range(len(request.mm_features)):
        if not manager.check_and_update_cache(request, i):
            manager.can_allocate(request, i, BUDGET, 0)
            manager.allocate(request, i)


#: Stand-ins with the manager's methods that change nothing: ``floor`` does
#: nothing at all (the cost of the call itself), ``reads`` reads from the
#: request what the manager reads (the Python side of vLLM's per-call API).
FLOORS = ("floor", "reads") if hasattr(_core, "_CallFloor") else ()


def floor(impl: str):
    """The PyO3 stand-in named ``impl`` (one of FLOORS)."""
    return _core._CallFloor(reads=impl == "reads")
