"""vLLM 0.33.0's own ``EmbeddingCache``, the baseline of the host-tier benches.

``vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py``
imports only the standard library, so it is loaded from a file without vLLM.
The file is found in the benches' vLLM cache folder (``vllm_baseline.cache_dir()``),
or in an installed vLLM 0.33.0 of this environment (read, not imported) and
then copied there; either copy is checked against its SHA-256 in the 0.33.0
wheel. Run the benches once with vLLM installed (or copy the file there by
hand) to have the baseline elsewhere; without it, its cases skip, saying why.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import types
from functools import cache
from pathlib import Path

import vllm_baseline

MEMBER = "vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py"
SHA256 = "a90e991ac30163bd00f6501b1c66389e92fa6a9c556a17070982e8336f350593"


def cached_path() -> Path:
    return vllm_baseline.cache_dir() / "embedding_cache.py"


def _source() -> bytes:
    path = cached_path()
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == SHA256:
        return path.read_bytes()
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is None or dist.version != vllm_baseline.VERSION:
        raise vllm_baseline.Unavailable(
            f"vLLM {vllm_baseline.VERSION}'s {MEMBER} is not at {path} and vLLM {vllm_baseline.VERSION} is not installed"
        )
    data = Path(dist.locate_file(MEMBER)).read_bytes()
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise vllm_baseline.Unavailable(
            f"the installed {MEMBER} is not vLLM {vllm_baseline.VERSION}'s (SHA-256 differs)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


@cache
def embedding_cache_class() -> type:
    """vLLM 0.33.0's ``EmbeddingCache``; raises ``vllm_baseline.Unavailable`` when it cannot be had."""
    module = types.ModuleType("vllm_0_33_embedding_cache")
    exec(compile(_source(), MEMBER, "exec"), module.__dict__)
    return module.EmbeddingCache
