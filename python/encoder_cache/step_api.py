"""Types of the managers' step-level API, which does one scheduler step's
encoder work for one request in one call (``try_schedule_encoder_inputs``,
``allocate_encoder_inputs``, ``free_encoder_inputs_before``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MismatchCallback", "StepResult"]

#: What ``try_schedule_encoder_inputs`` returns: ``(to_encode, num_new_tokens,
#: encoder_compute_budget, load_from_remote, repeated_in_step)``.
StepResult = tuple[list[int], int, int, list[int], list[int]]

#: Called when an item's embedding count disagrees with the cache or with an
#: earlier item of the same step: ``(request, input_id, identifier, cached, requested)``.
MismatchCallback = Callable[[Any, int, str, int, int], Any]
