"""The step-level API of the twin's managers: vLLM 0.33's
``Scheduler._try_schedule_encoder_inputs``, ``_allocate_encoder_inputs`` and
``_free_encoder_inputs``, as calls on the manager."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from encoder_cache.reference.request_fields import input_index, out_of_range
from encoder_cache.step_api import MismatchCallback, StepResult


class StepLevelAPI:
    """One call per request per scheduler step, built on the manager's
    per-item methods (``check_and_update_cache``, ``can_allocate``, ...)."""

    is_encoder_decoder: bool

    def try_schedule_encoder_inputs(
        self,
        request: Any,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
        *,
        disable_chunked_mm_input: bool = False,
        has_remote_item: Callable[[str], bool] | None = None,
        on_mismatch: MismatchCallback | None = None,
    ) -> StepResult:
        """Choose the request's items to encode for tokens
        ``[num_computed_tokens, num_computed_tokens + num_new_tokens)``.

        Returns ``(to_encode, num_new_tokens, encoder_compute_budget,
        load_from_remote, repeated_in_step)``, exactly as vLLM's scheduler
        computes them, and leaves the cache as vLLM's loop leaves it (hits
        taken, entries evicted to make room). A cache-size disagreement on an
        identifier rejects the request for this step: ``on_mismatch`` is told
        and ``([], 0, encoder_compute_budget, [], [])`` comes back.
        """
        features = request.mm_features
        if num_new_tokens == 0 or not features:
            return [], num_new_tokens, encoder_compute_budget, [], []
        enc_dec = self.is_encoder_decoder
        to_encode: list[int] = []
        from_remote: list[int] = []
        repeated: list[int] = []
        sizes_this_step: dict[str, int] = {}
        embeds_this_step = 0
        window_end = num_computed_tokens + num_new_tokens + shift_computed_tokens
        lo = (
            0
            if enc_dec
            else bisect.bisect_left(
                features, num_computed_tokens + 1, key=lambda f: f.mm_position.offset + f.mm_position.length
            )
        )
        hi = bisect.bisect_left(features, window_end, key=lambda f: f.mm_position.offset)
        for i in range(lo, hi):
            feature = features[i]
            position = feature.mm_position
            start, length = position.offset, position.length
            num_embeds = position.get_num_embeds()
            identifier = feature.identifier
            if enc_dec and num_computed_tokens > 0:
                if start != 0:
                    raise ValueError("encoder-decoder inputs must start at position 0")
                continue  # encoded before the first decoder token
            if (
                disable_chunked_mm_input
                and not enc_dec
                and num_computed_tokens <= start
                and num_computed_tokens + num_new_tokens < start + length
            ):
                # Never split an item: stop before it, the drafter shift included.
                num_new_tokens = max(0, start - (num_computed_tokens + shift_computed_tokens))
                break
            if not enc_dec:
                known = sizes_this_step.get(identifier)
                if known is None:
                    known = self.get_cached_num_encoder_embeds(request, i)
                    if known is not None and known != num_embeds:
                        return self._reject(
                            on_mismatch, request, i, identifier, known, num_embeds, encoder_compute_budget
                        )
                elif known != num_embeds:
                    return self._reject(on_mismatch, request, i, identifier, known, num_embeds, encoder_compute_budget)
                else:
                    repeated.append(i)
                    continue
                if self.check_and_update_cache(request, i):
                    continue
            if not self.can_allocate(request, i, encoder_compute_budget, embeds_this_step):
                # Encode an item whole or not at all: schedule the tokens before it, if any.
                num_new_tokens = min(num_new_tokens, start - num_computed_tokens) if num_computed_tokens < start else 0
                break
            first, last = position.get_embeds_indices_in_range(
                max(0, num_computed_tokens - start), min(length, window_end - start)
            )
            if last == first:
                continue  # only break/text tokens of the item fall in this step
            sizes_this_step[identifier] = num_embeds
            embeds_this_step += num_embeds
            if has_remote_item is not None and has_remote_item(identifier):
                from_remote.append(i)
                continue
            encoder_compute_budget -= num_embeds
            to_encode.append(i)
        return to_encode, num_new_tokens, encoder_compute_budget, from_remote, repeated

    @staticmethod
    def _reject(
        on_mismatch: MismatchCallback | None,
        request: Any,
        input_id: int,
        identifier: str,
        known: int,
        requested: int,
        encoder_compute_budget: int,
    ) -> StepResult:
        if on_mismatch is not None:
            on_mismatch(request, input_id, identifier, known, requested)
        return [], 0, encoder_compute_budget, [], []

    def allocate_encoder_inputs(self, request: Any, input_ids: list[int], duplicate_input_ids: list[int]) -> None:
        """Reserve the step's new items, then take the hits for its repeats.

        Every id is checked before anything changes; an allocation the cache
        refuses stops the call there (earlier ones stay)."""
        num_items = len(request.mm_features)
        for input_id in [*input_ids, *duplicate_input_ids]:
            if input_index(input_id) >= num_items:
                raise IndexError(out_of_range(input_id, num_items))
        for input_id in input_ids:
            self.allocate(request, input_id)
        for input_id in duplicate_input_ids:
            self.check_and_update_cache(request, input_id)

    def free_encoder_inputs_before(self, request: Any, position: int) -> list[int]:
        """Free the request's cached inputs whose placeholders end at or before
        ``position``; return their ids, ascending."""
        features = request.mm_features
        done = [
            i
            for i in sorted(self.get_cached_input_ids(request))
            if self._consumed(request, features[i].mm_position, position)
        ]
        for input_id in done:
            self.free_encoder_input(request, input_id)
        return done

    def _consumed(self, request: Any, placeholder: Any, position: int) -> bool:
        return placeholder.offset + placeholder.length <= position
