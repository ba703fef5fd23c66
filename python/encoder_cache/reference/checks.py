"""Checks of input values, with the Rust bindings' messages, and values
written into messages as the Rust core writes them."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["count", "finite_float", "request_str", "rust_debug", "rust_float", "state_str"]


def count(value: Any, what: str) -> int:
    """An int in [0, 2**63): the counts and sizes the managers take."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    if value >= 2**63:
        raise ValueError(f"{what} must be < 2**63, got {value}")
    return value


def request_str(value: Any, what: str) -> str:
    """A str read from a request (the message names the type found)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, not {type(value).__name__}")
    return value


def state_str(value: Any, what: str) -> str:
    """A str read from a state dump."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str")
    return value


def finite_float(value: Any, what: str) -> float:
    """A finite float >= 0 read from a state dump (an int is taken too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be float")
    value = float(value)
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{what} must be finite and >= 0, got {rust_float(value)}")
    return value


def rust_debug(value: str | list[str]) -> str:
    """A str, or a list of them, as Rust's ``{:?}`` writes it: double quotes."""
    return json.dumps(value, ensure_ascii=False)


def rust_float(value: float) -> str:
    """A float as Rust's ``{}`` writes it: no ``.0`` on whole numbers."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value):
        return str(int(value))
    return repr(value)
