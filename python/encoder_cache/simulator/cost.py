"""Encoder time: what encoding one item costs on the GPU.

``seconds(n) = (per_embed_us * n + per_embed_sq_us * n**2) / 1e6`` for an item
of ``n`` embeddings. The linear term is the vision transformer's weights
applied to every patch (and the projector); the quadratic term is its
attention, which compares every patch of the item with every other.

Defaults model a Qwen2.5-VL-7B-class vision encoder on an H100: a 675M-
parameter ViT, 32 layers of width 1280, 14-pixel patches merged 2x2 into one
embedding (4 patches per embedding), at an assumed 400 TFLOP/s sustained in
bf16:

- linear: 2 FLOPs per parameter per patch, 4 patches per embedding:
  2 * 675e6 * 4 / 400e12 s = 13.5 us per embedding;
- quadratic: per layer, QK^T and AV cost 4 * p^2 * d FLOPs for p = 4n
  patches, width d = 1280, over 32 layers: 4 * 16 * 1280 * 32 * n^2 / 400e12 s
  = 0.0066 us per embedding squared (full attention in every layer; models
  with windowed attention pay less).

A 1,280-embedding image then costs about 28 ms, a 64-embedding thumbnail
under 1 ms. docs/simulator.md compares this with published measurements;
``--encoder-us-per-embed`` and ``--encoder-us-per-embed-sq`` change it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_PER_EMBED_SQ_US", "DEFAULT_PER_EMBED_US", "EncoderCost"]

DEFAULT_PER_EMBED_US = 13.5
DEFAULT_PER_EMBED_SQ_US = 0.0066


@dataclass(frozen=True)
class EncoderCost:
    per_embed_us: float = DEFAULT_PER_EMBED_US
    per_embed_sq_us: float = DEFAULT_PER_EMBED_SQ_US

    def __post_init__(self) -> None:
        for name in ("per_embed_us", "per_embed_sq_us"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    def seconds(self, num_embeds: int) -> float:
        return (self.per_embed_us * num_embeds + self.per_embed_sq_us * num_embeds * num_embeds) * 1e-6
