"""Shared helpers: requests as vLLM shapes them, and both implementations."""

from __future__ import annotations

import pytest

import encoder_cache
from encoder_cache import reference
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request

IMPLEMENTATIONS = {
    "rust": encoder_cache.EncoderCacheManager,
    "python": reference.EncoderCacheManager,
}


def make_request(request_id: str, identifiers: list[str], sizes: list[int], gap: int = 1) -> Request:
    """A request whose items sit one after another, ``gap`` text tokens apart."""
    features = []
    offset = 0
    for identifier, size in zip(identifiers, sizes, strict=True):
        features.append(MultiModalFeature(identifier, PlaceholderRange(offset, size)))
        offset += size + gap
    return Request(request_id, features)


class OddFeature:
    """A feature with no modality and no placeholder: what the per-item calls read."""

    def __init__(self, identifier, size):
        self.identifier = identifier
        self.size = size


class OddRequest:
    """A request whose fields and sizes are whatever the test says (a size that
    is an exception is raised by ``get_num_encoder_embeds``)."""

    def __init__(self, request_id, identifiers, sizes):
        self.request_id = request_id
        self.mm_features = [OddFeature(i, s) for i, s in zip(identifiers, sizes, strict=True)]

    def get_num_encoder_embeds(self, input_id):
        size = self.mm_features[input_id].size
        if isinstance(size, Exception):
            raise size
        return size


def state(manager) -> dict:
    """Every readable field, as plain values, for comparing implementations."""
    return {
        "cache_size": manager.cache_size,
        "num_free_slots": manager.num_free_slots,
        "num_freeable_slots": manager.num_freeable_slots,
        "cached": {k: set(v) for k, v in manager.cached.items()},
        "num_embeds_by_hash": dict(manager.num_embeds_by_hash),
        "freeable": list(manager.freeable.items()),
        "request_cached_ids": {k: set(v) for k, v in manager.request_cached_ids.items()},
        "request_hash_refs": {k: dict(v) for k, v in manager.request_hash_refs.items()},
        "freed": list(manager.freed),
    }


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def manager_cls(request):
    return IMPLEMENTATIONS[request.param]
