"""Reading a request's fields the way the Rust managers do, with the same errors."""

from __future__ import annotations

import operator
from typing import Any

from encoder_cache.reference.checks import count, request_str

__all__ = ["input_index", "out_of_range", "read_identifier", "read_modality", "read_num_embeds", "read_request_id"]


def read_modality(request: Any, input_id: int) -> str:
    modality = getattr(request.mm_features[input_id], "modality", None)
    return modality if isinstance(modality, str) else "unknown"


def input_index(input_id: Any) -> int:
    input_id = operator.index(input_id)
    if input_id < 0:
        raise IndexError(f"input_id must be >= 0, got {input_id}")
    return input_id


def out_of_range(input_id: int, num_items: int) -> str:
    items = "item" if num_items == 1 else "items"
    return f"input_id {input_id} is out of range: the request has {num_items} multimodal {items}"


def read_identifier(request: Any, input_id: int) -> str:
    features = request.mm_features
    if isinstance(features, list) and input_id >= len(features):
        raise IndexError(out_of_range(input_id, len(features)))
    return request_str(features[input_id].identifier, "mm_features[i].identifier")


def read_request_id(request: Any) -> str:
    return request_str(request.request_id, "request.request_id")


def read_num_embeds(request: Any, input_id: int) -> int:
    return count(request.get_num_encoder_embeds(input_id), "request.get_num_encoder_embeds()")
