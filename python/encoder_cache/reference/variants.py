"""Two earlier vLLM behaviours, kept as small variants of the twin for comparison."""

from __future__ import annotations

from typing import Any

from encoder_cache.reference.manager import EncoderCacheManager


class PreFixEncoderCacheManager(EncoderCacheManager):
    """Before vLLM PR #54284: the first freed occurrence drops the reference."""

    def _last_occurrence(self, request: Any, request_id: str, mm_hash: str) -> bool:
        super()._last_occurrence(request, request_id, mm_hash)
        return True


class AnyScanEncoderCacheManager(EncoderCacheManager):
    """vLLM PR #54284 as merged: scan the request's remaining inputs on each free."""

    def _last_occurrence(self, request: Any, request_id: str, mm_hash: str) -> bool:
        super()._last_occurrence(request, request_id, mm_hash)
        features = request.mm_features
        return not any(features[other].identifier == mm_hash for other in self.request_inputs.get(request_id, ()))
