"""encoder-cache: vLLM's encoder-cache bookkeeping, in Rust.

``EncoderCacheManager`` and ``EncoderDecoderCacheManager`` are drop-in
replacements for vLLM 0.33's classes of the same names (same methods, same
readable state, same semantics), implemented in Rust. ``encoder_cache.reference``
holds the pure-Python implementation they are checked and measured against.
"""

import importlib.metadata as _metadata

from encoder_cache._core import HOST_POLICIES, POLICIES, EncoderCacheManager, EncoderDecoderCacheManager, HostBlockCache
from encoder_cache.budget import SchedulerConfig, compute_mm_encoder_budget
from encoder_cache.invariants import InvariantError
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request

try:
    __version__ = _metadata.version("encoder-cache")
except _metadata.PackageNotFoundError:  # imported from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "HOST_POLICIES",
    "POLICIES",
    "EncoderCacheManager",
    "EncoderDecoderCacheManager",
    "HostBlockCache",
    "InvariantError",
    "MultiModalFeature",
    "PlaceholderRange",
    "Request",
    "SchedulerConfig",
    "compute_mm_encoder_budget",
]
