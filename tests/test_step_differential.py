"""The Rust step-level API against the oracle: the pure-Python rendering of
vLLM 0.33's per-step scheduler loop over the pure-Python manager.

Hypothesis drives several requests through many scheduler steps (chunked
prefill, prefix-cache starts, partial windows, repeated items, ``is_embed``
masks, caches small enough to evict and roll back, remote items, chunking
disabled, drafter shift, streaming growth, reused identifiers with a different
size) on both implementations, and after every call compares what came back,
which callbacks were made, and every readable field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from step_helpers import ArrayPlaceholder, snapshot

import encoder_cache
from encoder_cache import MultiModalFeature, PlaceholderRange, Request, reference

PAIRS = {
    "shared": (encoder_cache.EncoderCacheManager, reference.EncoderCacheManager),
    "encoder_decoder": (encoder_cache.EncoderDecoderCacheManager, reference.EncoderDecoderCacheManager),
}
IDENTIFIERS = [f"h{i}" for i in range(6)]


@dataclass
class Live:
    """A request being served, and how far its prompt is."""

    request: Request
    prompt_len: int
    num_computed: int = 0


@dataclass
class Recorder:
    """Records the callbacks one implementation makes."""

    remote: frozenset[str]
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def has_remote_item(self, identifier: str) -> bool:
        self.calls.append(("remote", identifier))
        return identifier in self.remote

    def on_mismatch(self, request: Request, input_id: int, identifier: str, cached: int, requested: int) -> None:
        self.calls.append(("mismatch", request.request_id, input_id, identifier, cached, requested))


@st.composite
def placeholders(draw: st.DrawFn, offset: int, encoder_decoder: bool) -> Any:
    length = draw(st.integers(1, 9))
    mask = draw(st.none() | st.lists(st.booleans(), min_size=length, max_size=length))
    if draw(st.booleans()):
        return PlaceholderRange(0 if encoder_decoder else offset, length, None if mask is None else tuple(mask))
    return ArrayPlaceholder(0 if encoder_decoder else offset, length, mask)


@st.composite
def features(draw: st.DrawFn, start: int, count: int, encoder_decoder: bool) -> list[MultiModalFeature]:
    """``count`` items from token ``start`` on, sorted and apart; identifiers
    repeat across and within requests, usually with the same placeholder."""
    items = []
    offset = start
    for _ in range(count):
        offset += draw(st.integers(0, 6))
        identifier = draw(st.sampled_from(IDENTIFIERS))
        position = draw(placeholders(offset, encoder_decoder))
        items.append(MultiModalFeature(identifier, position))
        offset += position.length
    return items


def consistent(
    items: list[MultiModalFeature], shapes: dict[str, Any], encoder_decoder: bool
) -> list[MultiModalFeature]:
    """Mostly one placeholder shape per identifier, as real content hashes give.
    A shape longer than the drawn one moves the items after it, so placeholders
    never overlap (vLLM's window search relies on that, as ours does); an
    encoder-decoder model's all sit at 0."""
    out: list[MultiModalFeature] = []
    end = 0
    for item in items:
        shape = shapes.setdefault(item.identifier, item.mm_position)
        offset = 0 if encoder_decoder else max(item.mm_position.offset, end)
        if isinstance(shape, PlaceholderRange):
            position: Any = PlaceholderRange(offset, shape.length, shape.is_embed)
        else:
            position = ArrayPlaceholder(offset, shape.length, shape.is_embed)
        out.append(MultiModalFeature(item.identifier, position))
        end = offset + shape.length
    return out


def new_request(draw: st.DrawFn, n: int, encoder_decoder: bool, shapes: dict[str, Any]) -> Live:
    items = draw(features(draw(st.integers(0, 4)), draw(st.integers(1, 6)), encoder_decoder))
    if draw(st.integers(0, 9)):
        items = consistent(items, shapes, encoder_decoder)
    end = max(f.mm_position.offset + f.mm_position.length for f in items)
    live = Live(Request(f"r{n}", items), end + draw(st.integers(0, 5)))
    if not encoder_decoder and draw(st.integers(0, 4)) == 0:
        live.num_computed = live.request.num_computed_tokens = draw(st.integers(0, live.prompt_len))  # prefix hit
    return live


def check_same(rust: Any, ref: Any, call: str, *args: Any, **kwargs: Any) -> Any:
    """Call both; they must return the same or raise the same."""
    outcomes = []
    for manager in (rust, ref):
        try:
            outcomes.append(("ok", getattr(manager, call)(*args, **kwargs)))
        except (ValueError, IndexError, TypeError) as exc:
            outcomes.append(("raised", type(exc)))
    assert outcomes[0] == outcomes[1], call
    assert snapshot(rust) == snapshot(ref), call
    return outcomes[0][1] if outcomes[0][0] == "ok" else None


@pytest.mark.parametrize("kind", sorted(PAIRS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_steps_match_the_python_scheduler_loop(kind: str, data: st.DataObject) -> None:
    draw = data.draw
    encoder_decoder = kind == "encoder_decoder"
    rust_cls, ref_cls = PAIRS[kind]
    cache_size = draw(st.integers(0, 40))
    if encoder_decoder:
        rust, ref = rust_cls(cache_size), ref_cls(cache_size)
    else:
        policy = draw(st.sampled_from(encoder_cache.POLICIES))
        rust, ref = rust_cls(cache_size, policy=policy), ref_cls(cache_size, policy=policy)
    shapes: dict[str, Any] = {}
    live = [new_request(draw, n, encoder_decoder, shapes) for n in range(draw(st.integers(1, 3)))]
    next_id = len(live)

    for _ in range(draw(st.integers(1, 30))):
        budget = draw(st.integers(0, 30))
        disable_chunked = draw(st.integers(0, 3)) == 0
        shift = draw(st.sampled_from([0, 0, 1, 3]))
        remote = frozenset(draw(st.sets(st.sampled_from(IDENTIFIERS), max_size=2)))
        for entry in list(live):
            remaining = entry.prompt_len - entry.num_computed
            num_new = min(draw(st.integers(1, 16)), remaining) if remaining > 0 else 1
            recorders = Recorder(remote), Recorder(remote)
            results = [
                manager.try_schedule_encoder_inputs(
                    entry.request,
                    entry.num_computed,
                    num_new,
                    budget,
                    shift,
                    disable_chunked_mm_input=disable_chunked,
                    has_remote_item=recorder.has_remote_item if remote else None,
                    on_mismatch=recorder.on_mismatch,
                )
                for manager, recorder in zip((rust, ref), recorders)
            ]
            assert results[0] == results[1]
            assert recorders[0].calls == recorders[1].calls
            assert snapshot(rust) == snapshot(ref)
            requested = num_new
            to_encode, num_new, budget, from_remote, repeated = results[0]
            for name, seen in [
                ("encoded", to_encode),
                ("from remote", from_remote),
                ("repeated in step", repeated),
                ("cut short", num_new < requested),
                ("rejected", any(c[0] == "mismatch" for c in recorders[0].calls)),
                ("evicted", getattr(ref, "freed", None)),
            ]:
                if seen:
                    note_event(name)
            if to_encode or from_remote:
                check_same(rust, ref, "allocate_encoder_inputs", entry.request, to_encode + from_remote, repeated)
            entry.num_computed += num_new
            entry.request.num_computed_tokens = entry.num_computed
            placeholders_pending = draw(st.sampled_from([0, 0, 1]))
            freed = check_same(
                rust, ref, "free_encoder_inputs_before", entry.request, entry.num_computed - placeholders_pending
            )
            assert freed == sorted(freed)

        assert check_same(rust, ref, "get_freed_mm_hashes") is not None
        event = draw(st.sampled_from(["none"] * 4 + ["finish", "preempt", "grow", "rebuild", "join", "reset"]))
        entry = draw(st.sampled_from(live)) if live else None
        if event in ("finish", "preempt") and entry is not None:
            check_same(rust, ref, "free", entry.request)
            if event == "finish":
                live.remove(entry)
            else:
                entry.num_computed = entry.request.num_computed_tokens = 0
        elif event == "grow" and entry is not None:
            # Streaming input: more items after the prompt so far.
            more = draw(features(entry.prompt_len, draw(st.integers(1, 3)), encoder_decoder))
            entry.request.mm_features.extend(consistent(more, shapes, encoder_decoder))
            entry.prompt_len = max(f.mm_position.offset + f.mm_position.length for f in entry.request.mm_features)
        elif event == "rebuild" and entry is not None:
            # The same request id on a new object (the records must follow it).
            old = entry.request
            entry.request = Request(old.request_id, list(old.mm_features), old.num_computed_tokens)
        elif event == "join":
            live.append(new_request(draw, next_id, encoder_decoder, shapes))
            next_id += 1
        elif event == "reset":
            check_same(rust, ref, "reset")
