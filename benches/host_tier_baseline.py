"""vLLM 0.33.0's own ``EmbeddingCache``, the baseline of the host-tier benches.

``vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py``
imports only the standard library, so it is loaded from a file without vLLM.
The file is had as ``vllm_baseline`` has its baseline files: from the benches'
cache folder, an installed vLLM 0.33.0, or (``make bench``) the fetched wheel,
SHA-checked; without it, its cases skip, saying why.
"""

from __future__ import annotations

import types
from functools import cache

import vllm_baseline

MEMBER = vllm_baseline.HOST_TIER_MEMBER


@cache
def embedding_cache_class() -> type:
    """vLLM 0.33.0's ``EmbeddingCache``; raises ``vllm_baseline.Unavailable`` when it cannot be had."""
    module = types.ModuleType("vllm_0_33_embedding_cache")
    exec(compile(vllm_baseline.locate(MEMBER).read_bytes(), MEMBER, "exec"), module.__dict__)
    return module.EmbeddingCache
