"""The pure-Python twin: the baseline the Rust managers are measured and checked against.

``EncoderCacheManager`` here has the same API, semantics and errors as the Rust
``encoder_cache.EncoderCacheManager`` (vLLM 0.33's behaviour plus input
validation), including the eviction policies (``policy=``, the decisions of
:mod:`encoder_cache.reference.policies`), lookahead marks, resizing and
``stats()`` described in docs/policies.md; it also accepts a custom
:class:`EvictionPolicy` object. ``EncoderDecoderCacheManager`` is the twin of
the encoder-decoder manager. Two earlier behaviours are kept as small variants
for comparison:

- ``PreFixEncoderCacheManager``: a request's reference is dropped at the
  *first* freed occurrence of an item, so an item the request still needs can
  be evicted and encoded again (the bug vLLM PR #54284 fixed);
- ``AnyScanEncoderCacheManager``: the PR's fix as first written, scanning the
  request's remaining inputs on every free (O(k) per free, O(k^2) per request).

Modules: ``manager`` (the cache), ``steps`` (the step-level API),
``encoder_decoder``, ``variants``, ``policies`` (eviction policies and the
interface of a custom one), ``frequency_memory`` and ``shadows`` (what
``lfu-ghost`` and ``duel`` keep beside their orders), ``state`` (snapshots parsed and checked against
the invariants) and ``request_fields`` (reading a request).

Nothing in the runtime package (``encoder_cache``, ``encoder_cache.vllm``)
imports this package.
"""

from encoder_cache.reference.encoder_decoder import EncoderDecoderCacheManager
from encoder_cache.reference.event_log import DEFAULT_MAX_PENDING as EVENT_LOG_MAX_PENDING
from encoder_cache.reference.manager import EVICTED_MEMORY, STAT_COUNTERS, EncoderCacheManager
from encoder_cache.reference.policies import (
    GDSF_COST_SCALE,
    POLICIES,
    RECOMMENDED,
    S3FIFO_MAX_CREDIT,
    EvictionPolicy,
    GdsfPolicy,
    GhostLfuPolicy,
    S3FifoPolicy,
    VllmPolicy,
    make_policy,
)
from encoder_cache.reference.variants import AnyScanEncoderCacheManager, PreFixEncoderCacheManager

__all__ = [
    "EVENT_LOG_MAX_PENDING",
    "EVICTED_MEMORY",
    "GDSF_COST_SCALE",
    "POLICIES",
    "RECOMMENDED",
    "S3FIFO_MAX_CREDIT",
    "STAT_COUNTERS",
    "AnyScanEncoderCacheManager",
    "EncoderCacheManager",
    "EncoderDecoderCacheManager",
    "EvictionPolicy",
    "GdsfPolicy",
    "GhostLfuPolicy",
    "PreFixEncoderCacheManager",
    "S3FifoPolicy",
    "VllmPolicy",
    "make_policy",
]
