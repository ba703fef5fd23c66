"""vLLM PR #54284's two regression tests, on both implementations, plus the
pre-fix variant showing the bug they guard against."""

from conftest import make_request

from encoder_cache.reference import PreFixEncoderCacheManager


def test_repeated_item_stays_referenced_until_its_last_occurrence_is_freed(manager_cls):
    manager = manager_cls(cache_size=20)
    request = make_request("r1", ["imgA", "imgA"], [4, 4])

    manager.allocate(request, 0)
    assert manager.check_and_update_cache(request, 1)

    manager.free_encoder_input(request, 0)
    assert manager.cached["imgA"] == {"r1"}
    assert "imgA" not in manager.freeable
    assert manager.num_freeable_slots == 16

    manager.free_encoder_input(request, 1)
    assert not manager.cached["imgA"]
    assert manager.freeable["imgA"] == 4
    assert manager.num_freeable_slots == 20


def test_repeated_item_is_not_evicted_before_its_last_use(manager_cls):
    manager = manager_cls(cache_size=8)
    request = make_request("r1", ["imgA", "imgA"], [4, 4])
    other = make_request("r2", ["imgB"], [8])

    manager.allocate(request, 0)
    assert manager.check_and_update_cache(request, 1)
    manager.free_encoder_input(request, 0)

    assert not manager.can_allocate(other, 0, int(1e9), 0)
    assert manager.check_and_update_cache(request, 1)
    assert manager.get_freed_mm_hashes() == []


def test_before_the_fix_the_first_free_exposes_the_item_to_eviction():
    manager = PreFixEncoderCacheManager(cache_size=8)
    request = make_request("r1", ["imgA", "imgA"], [4, 4])
    other = make_request("r2", ["imgB"], [8])

    manager.allocate(request, 0)
    assert manager.check_and_update_cache(request, 1)
    manager.free_encoder_input(request, 0)

    assert manager.freeable == {"imgA": 4}
    assert manager.can_allocate(other, 0, int(1e9), 0)
    assert manager.get_freed_mm_hashes() == ["imgA"]
