"""Small request types with the shape vLLM's scheduler hands to the manager.

They let a scheduler outside vLLM (or a test) use the managers without vLLM
installed. Any object with the same attributes works just as well: the managers
duck-type ``request.request_id``, ``request.mm_features[i].identifier``,
``request.mm_features[i].mm_position`` and ``request.get_num_encoder_embeds(i)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

__all__ = ["MultiModalFeature", "PlaceholderRange", "Request"]


def _check_count(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")


@dataclass(frozen=True)
class PlaceholderRange:
    """Where an item's placeholder tokens sit in the prompt.

    ``is_embed``, when given, marks which of the ``length`` placeholder tokens
    receive an encoder embedding (the others are break or text tokens that the
    cache does not store).
    """

    offset: int
    length: int
    is_embed: Sequence[bool] | None = None
    _cumsum: tuple[int, ...] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not (type(self.offset) is int and type(self.length) is int and self.offset >= 0 and self.length >= 0):
            _check_count(self.offset, "offset")  # the common case above skips the calls
            _check_count(self.length, "length")
        if self.is_embed is not None:
            mask = tuple(bool(x) for x in self.is_embed)
            if len(mask) != self.length:
                raise ValueError(f"is_embed has {len(mask)} entries for a placeholder of length {self.length}")
            object.__setattr__(self, "is_embed", mask)
            # ints, not bools: accumulate() passes the first element through as is.
            object.__setattr__(self, "_cumsum", tuple(accumulate(map(int, mask))))

    def get_num_embeds(self) -> int:
        """Embeddings the encoder produces for this item."""
        if self._cumsum is None:
            return self.length
        return self._cumsum[-1] if self._cumsum else 0

    def get_embeds_indices_in_range(self, start_idx: int, end_idx: int) -> tuple[int, int]:
        """The embeddings (start, end) covered by placeholder tokens [start_idx, end_idx)."""
        if self._cumsum is None:
            return start_idx, end_idx
        start = self._cumsum[start_idx - 1] if start_idx > 0 else 0
        end = self._cumsum[end_idx - 1] if end_idx > 0 else 0
        return start, end


@dataclass(frozen=True)
class MultiModalFeature:
    """One multimodal item of a request: its content hash and its placeholder."""

    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"

    def __post_init__(self) -> None:
        if type(self.identifier) is str and type(self.mm_position) is PlaceholderRange and type(self.modality) is str:
            return  # the common case, checked without the calls below
        _check_str(self.identifier, "identifier")
        if not all(hasattr(self.mm_position, name) for name in ("offset", "length", "get_num_embeds")):
            raise TypeError(
                f"mm_position must be a PlaceholderRange (offset, length, get_num_embeds()), "
                f"not {type(self.mm_position).__name__}"
            )
        _check_str(self.modality, "modality")


@dataclass(eq=False)
class Request:
    """A request as the encoder-cache managers see it.

    ``mm_features`` must be sorted by placeholder offset (as vLLM keeps them);
    appending items later, as streaming sessions do, is supported.
    """

    request_id: str
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0

    def __post_init__(self) -> None:
        _check_str(self.request_id, "request_id")
        if not isinstance(self.mm_features, list):
            raise TypeError(f"mm_features must be a list of MultiModalFeature, not {type(self.mm_features).__name__}")
        if not all(type(feature) is MultiModalFeature for feature in self.mm_features):
            for i, feature in enumerate(self.mm_features):
                # Duck-typed features are welcome, and reading their attributes here could run their
                # code: only built-in values (None, numbers, strings, containers) are refused.
                if type(feature).__module__ == "builtins":
                    raise TypeError(
                        f"mm_features[{i}] must be a MultiModalFeature (identifier, mm_position), "
                        f"not {type(feature).__name__}"
                    )
        _check_count(self.num_computed_tokens, "num_computed_tokens")
        _check_count(self.num_output_placeholders, "num_output_placeholders")

    @property
    def has_encoder_inputs(self) -> bool:
        return len(self.mm_features) > 0

    @property
    def num_prompt_tokens(self) -> int:
        """The shortest prompt that holds every item: the end of the last placeholder (0 without items)."""
        return max((f.mm_position.offset + f.mm_position.length for f in self.mm_features), default=0)

    def get_num_encoder_embeds(self, input_id: int) -> int:
        return self.mm_features[input_id].mm_position.get_num_embeds()
