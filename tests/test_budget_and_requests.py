"""compute_mm_encoder_budget and the package's own request types."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from encoder_cache import MultiModalFeature, PlaceholderRange, Request, SchedulerConfig, compute_mm_encoder_budget


def test_budget_is_at_least_the_largest_item():
    config = SchedulerConfig(max_num_batched_tokens=2048)
    assert compute_mm_encoder_budget(config, {"image": 576, "video": 4096}) == (4096, 4096)
    assert compute_mm_encoder_budget(config, {"image": 576}) == (2048, 2048)


def test_budget_reads_the_encoder_limits_separately():
    config = SchedulerConfig(max_num_batched_tokens=1024, max_num_encoder_input_tokens=3000, encoder_cache_size=9000)
    assert compute_mm_encoder_budget(config, {"image": 1280}) == (3000, 9000)


def test_budget_accepts_any_object_with_vllm_scheduler_config_fields():
    vllm_like = SimpleNamespace(
        max_num_batched_tokens=8192,
        max_num_encoder_input_tokens=8192,
        encoder_cache_size=16384,
        disable_chunked_mm_input=False,
    )
    assert compute_mm_encoder_budget(vllm_like, {"image": 100}) == (8192, 16384)


def test_no_modality_means_no_encoder_cache(caplog):
    with caplog.at_level(logging.WARNING):
        assert compute_mm_encoder_budget(SchedulerConfig(max_num_batched_tokens=64), {}) == (0, 0)
    assert "encoder cache is not used" in caplog.text


def test_unchunked_items_larger_than_a_step_are_refused():
    config = SchedulerConfig(max_num_batched_tokens=512, disable_chunked_mm_input=True)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        compute_mm_encoder_budget(config, {"image": 513})
    assert compute_mm_encoder_budget(config, {"image": 512}) == (512, 512)


def test_placeholder_without_mask_embeds_every_token():
    placeholder = PlaceholderRange(offset=10, length=5)
    assert placeholder.get_num_embeds() == 5
    assert placeholder.get_embeds_indices_in_range(1, 4) == (1, 4)


def test_placeholder_mask_selects_the_embedded_tokens():
    placeholder = PlaceholderRange(offset=2, length=5, is_embed=[False, True, False, True, True])
    assert placeholder.get_num_embeds() == 3
    assert placeholder.get_embeds_indices_in_range(3, 5) == (1, 3)
    assert placeholder.get_embeds_indices_in_range(0, 1) == (0, 0)
    assert placeholder.get_embeds_indices_in_range(0, 5) == (0, 3)
    with pytest.raises(ValueError, match="is_embed"):
        PlaceholderRange(offset=0, length=3, is_embed=[True])


def test_request_reports_its_items():
    request = Request("r1", [MultiModalFeature("a", PlaceholderRange(0, 4, is_embed=[True, False, True, True]))])
    assert request.has_encoder_inputs
    assert request.get_num_encoder_embeds(0) == 3
    assert not Request("r2").has_encoder_inputs
