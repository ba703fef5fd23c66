"""The wire format of encoder-cache events: vLLM's KV-event transport, our own event types.

Frames on the PUB socket, one message per scheduler step that changed the cache:

- ``topic`` (bytes; ``DEFAULT_TOPIC`` unless configured);
- the batch's sequence number: 8 bytes, big-endian, unsigned, from 0, one per batch;
- the payload: msgpack of ``[timestamp, events, engine]``: seconds since the
  epoch (float), the list of events in the order they happened, and the
  engine's index (vLLM's data-parallel rank, or 0).

Each event is a msgpack map tagged by ``"type"``:

- ``{"type": "EncoderCacheStored", "hash": str, "embeds": int, "modality": str, "medium": "GPU"}``:
  an entry was allocated for the item ``hash`` (vLLM's ``mm_features[i].identifier``)
  holding ``embeds`` encoder embeddings;
- ``{"type": "EncoderCacheRemoved", "hashes": [str, ...], "medium": "GPU"}``:
  the workers were told to drop these entries (``get_freed_mm_hashes``);
- ``{"type": "EncoderCacheCleared"}``: every entry is gone (``reset()``).

Replay (an optional ROUTER socket): a client sends one frame, the 8-byte
big-endian sequence number to start from (from a DEALER socket, preceded by an
empty delimiter frame; a REQ socket adds it itself); the publisher answers with
``(topic, sequence, payload)`` for every batch still in its ring from that
number on, then ``(b"", END_SEQ, b"")``: sequence -1 (8 bytes, signed) and an
empty payload.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "CLEARED",
    "DEFAULT_TOPIC",
    "END_SEQ",
    "MEDIUM",
    "REMOVED",
    "STORED",
    "cleared",
    "codec",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
    "removed",
    "stored",
]

DEFAULT_TOPIC = "encoder-cache"
MEDIUM = "GPU"
STORED = "EncoderCacheStored"
REMOVED = "EncoderCacheRemoved"
CLEARED = "EncoderCacheCleared"
#: The sequence frame that ends a replay.
END_SEQ = (-1).to_bytes(8, "big", signed=True)

INSTALL_HINT = "pip install 'encoder-cache[metrics]'"


class _Codec:
    """msgpack's packb/unpackb, or msgspec's msgpack functions (which vLLM installs)."""

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError:
            try:
                from msgspec import msgpack as msgspec_msgpack
            except ImportError as exc:
                raise ImportError(f"encoder-cache events need msgpack and pyzmq: {INSTALL_HINT}") from exc
            self.pack = msgspec_msgpack.encode
            self.unpack = msgspec_msgpack.decode
        else:
            self.pack = functools.partial(msgpack.packb, use_bin_type=True)
            self.unpack = msgpack.unpackb


_CODEC: _Codec | None = None


def codec() -> _Codec:
    """The msgpack codec in use (raises ImportError, saying what to install, without one)."""
    global _CODEC
    if _CODEC is None:
        _CODEC = _Codec()
    return _CODEC


def stored(mm_hash: str, embeds: int, modality: str, medium: str = MEDIUM) -> dict[str, Any]:
    return {"type": STORED, "hash": mm_hash, "embeds": embeds, "modality": modality, "medium": medium}


def removed(hashes: list[str], medium: str = MEDIUM) -> dict[str, Any]:
    return {"type": REMOVED, "hashes": hashes, "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": CLEARED}


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def decode_seq(frame: bytes) -> int:
    """A sequence frame's number; -1 for ``END_SEQ``."""
    if len(frame) != 8:
        raise ValueError(f"a sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def encode_batch(timestamp: float, events: list[dict[str, Any]], engine: int) -> bytes:
    return codec().pack([timestamp, events, engine])


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    """``(timestamp, events, engine)`` of a payload; ValueError if it is not one."""
    batch = codec().unpack(payload)
    if not isinstance(batch, list) or len(batch) not in (2, 3) or not isinstance(batch[1], list):
        raise ValueError("an event batch is [timestamp, events, engine]")
    return batch[0], batch[1], batch[2] if len(batch) == 3 else None
