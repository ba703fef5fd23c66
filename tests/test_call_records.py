"""The Rust manager's per-call methods keep what they read of an item per
request object: ``identifier`` and ``get_num_encoder_embeds(i)`` are read once
while ``mm_features[i]`` stays the same object, and ``get_cached_input_ids``
hands out one set per holding of the request's inputs. These tests
pin down when the records are used, when they are read afresh, and that they
never outlive the requests they describe."""

from __future__ import annotations

import gc
import random
import weakref

import pytest
from conftest import make_request, state

import encoder_cache
from encoder_cache import reference
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request


class CountingFeature:
    """A feature that counts reads of its identifier."""

    def __init__(self, identifier: str, offset: int, length: int) -> None:
        self._identifier = identifier
        self.mm_position = PlaceholderRange(offset, length)
        self.identifier_reads = 0

    @property
    def identifier(self) -> str:
        self.identifier_reads += 1
        return self._identifier


class CountingRequest:
    """A request that counts ``get_num_encoder_embeds`` calls per input."""

    def __init__(self, request_id: str, features: list) -> None:
        self.request_id = request_id
        self.mm_features = features
        self.size_calls = [0] * len(features)

    def get_num_encoder_embeds(self, input_id: int) -> int:
        self.size_calls[input_id] += 1
        return self.mm_features[input_id].mm_position.get_num_embeds()


def dying(base: type, manager, seen: list) -> type:
    """A subclass of ``base`` whose finaliser reads ``manager.num_free_slots``
    into ``seen``, or the exception that read raised."""

    class Dying(base):
        def __del__(self) -> None:
            try:
                seen.append(manager.num_free_slots)
            except Exception as err:  # the finaliser reports what it met
                seen.append(err)

    return Dying


def schedule_one(manager, request, input_id: int) -> bool:
    """What vLLM's scheduler does for one item: a hit, or room and an allocation."""
    if manager.check_and_update_cache(request, input_id):
        return True
    assert manager.can_allocate(request, input_id, 100, 0)
    manager.allocate(request, input_id)
    return False


def test_an_item_is_read_once_per_feature_object() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    features = [CountingFeature("a", 0, 4), CountingFeature("b", 5, 6)]
    request = CountingRequest("r", features)
    assert [schedule_one(manager, request, i) for i in range(2)] == [False, False]
    assert manager.check_and_update_cache(request, 1)  # a held input: a hit
    assert manager.can_allocate(request, 1, 100, 0)
    assert manager.get_cached_num_encoder_embeds(request, 0) == 4
    assert [f.identifier_reads for f in features] == [1, 1]
    assert request.size_calls == [1, 1]
    assert manager.num_embeds_by_hash == {"a": 4, "b": 6}


def test_known_classes_are_read_once_asking_only_a_masked_item_for_its_size(monkeypatch) -> None:
    # With vLLM's or our own classes, an item's facts are read as fields at its
    # first sight; only a masked item makes the request count its embeddings.
    asked: list[int] = []
    counted = encoder_cache.Request.get_num_encoder_embeds

    def counting(self, input_id: int) -> int:
        asked.append(input_id)
        return counted(self, input_id)

    monkeypatch.setattr(encoder_cache.Request, "get_num_encoder_embeds", counting)
    mask = [True, False, True, True, False]
    features = [
        MultiModalFeature("a", PlaceholderRange(0, 4)),
        MultiModalFeature("b", PlaceholderRange(5, 5, is_embed=mask)),
        MultiModalFeature("c", PlaceholderRange(11, 2), modality="video"),
    ]
    rust, twin = encoder_cache.EncoderCacheManager(100), reference.EncoderCacheManager(100)
    for manager in (twin, rust):
        asked.clear()
        request = encoder_cache.Request("r", features)
        assert [schedule_one(manager, request, i) for i in range(3)] == [False, False, False]
        assert [manager.get_cached_num_encoder_embeds(request, i) for i in range(3)] == [4, 3, 2]
    assert asked == [1], "the Rust manager asks only for the masked item's size, once"
    assert rust.num_embeds_by_hash == twin.num_embeds_by_hash == {"a": 4, "b": 3, "c": 2}
    assert rust.stats()["by_modality"] == twin.stats()["by_modality"]


def test_a_bad_field_of_a_known_class_is_refused_with_the_manager_usable() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    features = [MultiModalFeature("a", PlaceholderRange(0, 4)), MultiModalFeature("b", PlaceholderRange(5, 4))]
    request = encoder_cache.Request("r", features)
    assert not schedule_one(manager, request, 0)  # the request's record is made here
    object.__setattr__(features[1], "identifier", 5)
    with pytest.raises(TypeError, match=r"identifier must be str, not int"):
        manager.check_and_update_cache(request, 1)
    assert manager.get_cached_input_ids(request) == {0}, "the refusal changed nothing"
    object.__setattr__(features[1], "identifier", "b")
    assert not schedule_one(manager, request, 1)
    assert manager.get_cached_input_ids(request) == {0, 1}
    manager.check_invariants()


class CountingId(CountingRequest):
    """A request, always "r", that counts reads of its ``request_id``."""

    def __init__(self, features: list) -> None:
        self.id_reads = 0
        super().__init__("r", features)

    @property  # type: ignore[override]
    def request_id(self) -> str:
        self.id_reads += 1
        return "r"

    @request_id.setter
    def request_id(self, value: str) -> None:
        pass


def test_the_request_id_is_read_once_per_request_object() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    request = CountingId([CountingFeature("a", 0, 4), CountingFeature("b", 5, 4)])
    for i in range(2):
        schedule_one(manager, request, i)
    assert manager.get_cached_input_ids(request) == {0, 1}
    manager.free_encoder_input(request, 0)
    assert manager.try_schedule_encoder_inputs(request, 0, 10, 100)[0] == []
    assert request.id_reads == 1
    manager.free(request)
    assert manager.request_cached_ids == {}
    manager.get_cached_input_ids(request)
    assert request.id_reads == 2, "free(request) forgets the request: its id is read again"


def test_a_request_only_asked_for_its_inputs_is_read_once() -> None:
    # vLLM asks every running request for its cached inputs on every step, also
    # one whose items all lie in its cached KV prefix and are never looked up.
    manager = encoder_cache.EncoderCacheManager(100)
    request = CountingId([CountingFeature("a", 0, 4)])
    assert [manager.get_cached_input_ids(request) for _ in range(3)] == [set(), set(), set()]
    assert request.id_reads == 1
    schedule_one(manager, request, 0)
    assert manager.get_cached_input_ids(request) == {0}
    assert request.id_reads == 1, "the scheduling calls found the record too"
    manager.free(request)
    assert manager.get_cached_input_ids(request) == set()
    assert request.id_reads == 2


def test_free_drops_what_it_kept_with_the_manager_usable() -> None:
    # The record may hold the last reference to an item (here the request's
    # list was rebound); whatever that item's finaliser does with the manager
    # must find it usable, so free(request) drops the record after its borrow.
    manager = encoder_cache.EncoderCacheManager(100)
    seen: list = []

    class DyingFeature(CountingFeature):
        def __del__(self) -> None:
            try:
                seen.append(manager.stats()["misses"])
            except Exception as err:  # the finaliser reports what it met
                seen.append(err)

    request = CountingRequest("r", [DyingFeature("a", 0, 4)])
    assert not schedule_one(manager, request, 0)
    request.mm_features = []
    manager.free(request)
    assert seen == [1]
    assert manager.request_hash_refs == {}


def test_reset_drops_what_it_kept_with_the_manager_usable() -> None:
    # reset() forgets every record; a request whose last reference was its
    # record goes then, and its finaliser must find the manager usable.
    manager = encoder_cache.EncoderCacheManager(100)
    seen: list = []
    request = dying(CountingRequest, manager, seen)("r", [CountingFeature("a", 0, 4)])
    assert not schedule_one(manager, request, 0)
    del request
    assert seen == [], "the manager's record keeps the request"
    manager.reset()
    assert seen == [100]


def test_a_replaced_feature_is_read_again() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    request = CountingRequest("r", [CountingFeature("a", 0, 4)])
    assert not schedule_one(manager, request, 0)
    manager.free_encoder_input(request, 0)
    replacement = CountingFeature("b", 0, 7)
    request.mm_features[0] = replacement
    assert not manager.check_and_update_cache(request, 0), "b is not cached: a must not be taken"
    assert manager.can_allocate(request, 0, 100, 0)
    manager.allocate(request, 0)
    assert manager.num_embeds_by_hash == {"a": 4, "b": 7}
    assert manager.request_hash_refs == {"r": {"b": 1}}
    assert (replacement.identifier_reads, request.size_calls) == (1, [2])


def test_another_object_under_the_same_id_is_read_afresh() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    first = CountingRequest("r", [CountingFeature("a", 0, 4)])
    assert not schedule_one(manager, first, 0)
    manager.free(first)
    second = CountingRequest("r", [CountingFeature("c", 0, 3)])
    assert not schedule_one(manager, second, 0)
    assert manager.request_hash_refs == {"r": {"c": 1}}
    assert second.size_calls == [1]


def test_a_grown_feature_list_reads_only_the_new_items() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    features = [CountingFeature("a", 0, 4)]
    request = CountingRequest("r", features)
    assert not schedule_one(manager, request, 0)
    features.append(CountingFeature("b", 5, 2))
    request.size_calls.append(0)
    assert not schedule_one(manager, request, 1)
    assert manager.check_and_update_cache(request, 0)
    assert [f.identifier_reads for f in features] == [1, 1]
    assert request.size_calls == [1, 1]


def test_the_feature_list_is_read_only_past_the_recorded_one() -> None:
    # Every call indexes the mm_features list the record kept, also at an
    # item's first sight (vLLM extends a request's list in place); the
    # attribute is read again only for an index past that list.
    class CountingList(CountingRequest):
        list_reads = 0

        @property  # type: ignore[override]
        def mm_features(self) -> list:
            CountingList.list_reads += 1
            return self._features

        @mm_features.setter
        def mm_features(self, value: list) -> None:
            self._features = value

        def get_num_encoder_embeds(self, input_id: int) -> int:
            self.size_calls[input_id] += 1
            return self._features[input_id].mm_position.get_num_embeds()

    manager = encoder_cache.EncoderCacheManager(100)
    request = CountingList("r", [CountingFeature("a", 0, 4)])
    assert not schedule_one(manager, request, 0)
    assert CountingList.list_reads == 1, "one read of the attribute for the request's first item"
    assert manager.get_cached_num_encoder_embeds(request, 0) == 4
    assert manager.check_and_update_cache(request, 0)
    request._features.append(CountingFeature("b", 5, 2))
    request.size_calls.append(0)
    assert not schedule_one(manager, request, 1)
    assert CountingList.list_reads == 1, "an item appended to the recorded list is found there"
    with pytest.raises(IndexError):
        manager.check_and_update_cache(request, 2)
    assert CountingList.list_reads == 2, "an index past the recorded list reads the attribute"
    with pytest.raises(IndexError):
        manager.get_cached_num_encoder_embeds(request, 2)
    assert CountingList.list_reads == 3, "so does the getter's"
    assert manager.get_cached_num_encoder_embeds(request, 1) == 2
    assert CountingList.list_reads == 3, "and an index within it does not"
    assert manager.request_hash_refs == {"r": {"a": 1, "b": 1}}
    assert request.size_calls == [1, 1]
    manager.free(request)
    request.mm_features = [CountingFeature("c", 0, 3)]
    assert not schedule_one(manager, request, 0), "after free(request) the list is read afresh"
    assert manager.request_hash_refs == {"r": {"c": 1}}


class FreeingFeature(CountingFeature):
    """A feature whose first identifier read frees its request from the manager."""

    manager = None
    request = None

    @property
    def identifier(self) -> str:
        if self.identifier_reads == 0:
            self.manager.free(self.request)
        return super().identifier


@pytest.mark.parametrize("call", ["check_and_update_cache", "allocate"])
def test_a_read_that_frees_the_request_mid_call_is_served_as_vllm_serves_it(call: str) -> None:
    """The records knew the request when the call began and were dropped by
    the read: the call goes on with what it read, and the state matches the
    pure-Python manager's."""
    states = []
    for cls in (encoder_cache.EncoderCacheManager, reference.EncoderCacheManager):
        manager = cls(100)
        late = FreeingFeature("b", 5, 2)
        request = CountingRequest("r", [CountingFeature("a", 0, 4), late])
        late.manager, late.request = manager, request
        assert not schedule_one(manager, request, 0)
        assert getattr(manager, call)(request, 1) in (False, None)
        states.append(state(manager))
    assert states[0] == states[1]
    expected_held = {"r": {1}} if call == "allocate" else {}
    assert states[0]["request_cached_ids"] == expected_held


class SizeOnly:
    """Only what vLLM's can_allocate reads: no request id, no features."""

    def get_num_encoder_embeds(self, input_id: int) -> int:
        return 8


@pytest.mark.parametrize("budget, expected", [(8, True), (7, False)])
def test_can_allocate_asks_a_request_it_cannot_place_for_the_size(budget: int, expected: bool) -> None:
    managers = [encoder_cache.EncoderCacheManager(10), reference.EncoderCacheManager(10)]
    assert [m.can_allocate(SizeOnly(), 0, budget, 0) for m in managers] == [expected, expected]


def test_can_allocate_serves_a_request_without_an_id_asking_for_the_size_once() -> None:
    """Items but no request id: nothing can be recorded, and the size is still read only once."""

    class Anonymous(SizeOnly):
        mm_features = [MultiModalFeature("a", PlaceholderRange(0, 8))]
        size_calls = 0

        def get_num_encoder_embeds(self, input_id: int) -> int:
            Anonymous.size_calls += 1
            return super().get_num_encoder_embeds(input_id)

    managers = [encoder_cache.EncoderCacheManager(10), reference.EncoderCacheManager(10)]
    assert [m.can_allocate(Anonymous(), 0, 8, 0) for m in managers] == [True, True]
    assert Anonymous.size_calls == 2


def test_can_allocate_does_not_swallow_an_interrupt() -> None:
    class Interrupting(SizeOnly):
        mm_features = [MultiModalFeature("a", PlaceholderRange(0, 8))]

        @property
        def request_id(self) -> str:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        encoder_cache.EncoderCacheManager(10).can_allocate(Interrupting(), 0, 8, 0)


def test_get_cached_input_ids_follows_every_change_and_never_changes_an_answer() -> None:
    rust, python = encoder_cache.EncoderCacheManager(100), reference.EncoderCacheManager(100)
    request = make_request("r", ["a", "b", "a"], [4, 4, 4])
    other = make_request("o", ["b"], [4])
    answers: list[tuple[set[int], set[int]]] = []  # every answer, with a copy of it as it was given

    def check() -> None:
        got = rust.get_cached_input_ids(request)
        assert type(got) is set
        assert got == python.get_cached_input_ids(request)
        answers.append((got, set(got)))
        for answer, as_given in answers:
            assert answer == as_given, "an answer handed out is never changed afterwards"

    steps = [
        lambda m: schedule_one(m, request, 0),
        lambda m: schedule_one(m, request, 1),
        lambda m: schedule_one(m, other, 0),  # another request's change leaves r's set as it was
        lambda m: m.check_and_update_cache(request, 2),
        lambda m: m.free_encoder_input(request, 0),
        lambda m: m.free(request),
        lambda m: schedule_one(m, request, 1),
        lambda m: m.reset(),
        lambda m: schedule_one(m, request, 2),
    ]
    check()
    for step in steps:
        step(rust)
        step(python)
        check()
        assert state(rust) == state(python)


@pytest.mark.parametrize("already_held", [0, 6], ids=["few ids", "many ids"])
def test_get_cached_input_ids_shares_an_answer_while_the_holdings_stay(already_held: int) -> None:
    """One set per holding: handed out again while the request holds the
    same inputs, replaced by a new one when they change."""
    manager = encoder_cache.EncoderCacheManager(100)
    names = [f"i{k}" for k in range(already_held)] + ["a", "b", "c"]
    request = make_request("r", names, [4] * len(names))
    for input_id in range(already_held):
        schedule_one(manager, request, input_id)
    first = already_held
    base = set(range(already_held))
    schedule_one(manager, request, first)
    held = manager.get_cached_input_ids(request)
    assert held == base | {first}
    assert manager.get_cached_input_ids(request) is held
    schedule_one(manager, request, first + 1)
    assert held == base | {first}, "a change to the holdings does not reach an answer given"
    again = manager.get_cached_input_ids(request)
    assert again == base | {first, first + 1} and again is not held
    again.add(77)  # against the contract; a change of size is caught all the same
    assert manager.get_cached_input_ids(request) == base | {first, first + 1}
    # As in vLLM's scheduler, but safe here even without list(): the answer does not change under the loop.
    for input_id in manager.get_cached_input_ids(request):
        manager.free_encoder_input(request, input_id)
    assert manager.get_cached_input_ids(request) == set()


def test_an_input_set_follows_changes_made_through_another_request_object() -> None:
    """The answer kept for one request object is not handed out again once the
    holdings change through another object with the same id, nor once the
    request lets go of everything and comes back holding the same inputs."""
    manager = encoder_cache.EncoderCacheManager(100)
    one, other = (make_request("r", ["a", "b"], [4, 4]) for _ in range(2))
    schedule_one(manager, one, 0)
    held = manager.get_cached_input_ids(one)
    assert held == {0} and manager.get_cached_input_ids(one) is held
    schedule_one(manager, other, 1)
    assert manager.get_cached_input_ids(one) == {0, 1}
    manager.free_encoder_input(other, 1)
    again = manager.get_cached_input_ids(one)
    assert again == {0}
    manager.free(other)
    assert manager.get_cached_input_ids(one) == set()
    schedule_one(manager, other, 0)
    back = manager.get_cached_input_ids(one)
    assert back == {0} and back is not again
    back.add(1)  # against the contract, and caught: the set handed out changed size
    assert manager.get_cached_input_ids(one) == {0}


def test_a_subclass_that_reads_requests_while_built_is_restored_without_stale_answers() -> None:
    request = make_request("r", ["a", "b"], [4, 4])

    class Eager(encoder_cache.EncoderCacheManager):
        def __init__(self, cache_size: int) -> None:
            schedule_one(self, request, 1)
            assert self.get_cached_input_ids(request) == {1}

    source = encoder_cache.EncoderCacheManager(100)
    schedule_one(source, request, 0)
    restored = Eager.restore(source.snapshot())
    assert restored.get_cached_input_ids(request) == {0}


def test_a_restored_manager_gives_the_restored_input_sets() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    request = make_request("r", ["a", "b"], [4, 4])
    schedule_one(manager, request, 0)
    assert manager.get_cached_input_ids(request) == {0}
    snapshot = manager.snapshot()
    schedule_one(manager, request, 1)
    restored = encoder_cache.EncoderCacheManager.restore(snapshot)
    assert restored.get_cached_input_ids(request) == {0}
    schedule_one(restored, request, 1)
    assert restored.get_cached_input_ids(request) == {0, 1}


def test_free_lets_the_request_go() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    request = make_request("r", ["a"], [4])
    schedule_one(manager, request, 0)
    manager.get_cached_input_ids(request)
    gone = weakref.ref(request)
    manager.free(request)
    del request
    gc.collect()
    assert gone() is None


def test_records_of_requests_dropped_without_free_do_not_pile_up() -> None:
    """A caller that never calls free(request): the records are bounded, the
    oldest going first, so the requests it has dropped are released."""
    manager = encoder_cache.EncoderCacheManager(10)
    early = []
    for n in range(5000):
        request = make_request(f"r{n}", [f"item{n}"], [4])
        assert manager.can_allocate(request, 0, 100, 0)
        assert not manager.check_and_update_cache(request, 0)
        if n < 100:
            early.append(weakref.ref(request))
    del request
    gc.collect()
    assert sum(ref() is not None for ref in early) == 0


@pytest.mark.parametrize(
    "first_sight",
    [
        lambda manager, request: manager.check_and_update_cache(request, 0),
        lambda manager, request: manager.get_cached_input_ids(request),
        lambda manager, request: manager.try_schedule_encoder_inputs(request, 0, 8, 100),
    ],
    ids=["per-call", "get_cached_input_ids", "step-level"],
)
def test_a_record_pushed_out_is_dropped_with_the_manager_usable(first_sight) -> None:
    # Past the records' bound the oldest record goes; when it held the last
    # reference to its request, that request's finaliser runs then, and must
    # find the manager usable, whichever call made the new record.
    manager = encoder_cache.EncoderCacheManager(10)
    seen: list = []
    first_sight(manager, dying(Request, manager, seen)("dying", [MultiModalFeature("a", PlaceholderRange(0, 4))]))
    assert seen == [], "the manager's record keeps the request"
    for n in range(5000):  # more requests than the records' bound
        first_sight(manager, make_request(f"r{n}", [f"item{n}"], [4]))
    assert seen == [10]


def test_records_of_requests_still_in_use_survive_others_coming_and_going() -> None:
    """vLLM frees every request it is done with: however many come and go, the
    record of one it is still working on stays."""
    manager = encoder_cache.EncoderCacheManager(10**6)
    kept = CountingRequest("kept", [CountingFeature("k", 0, 4)])
    assert manager.can_allocate(kept, 0, 100, 0)
    for n in range(5000):  # more requests than the records' bound
        request = make_request(f"r{n}", [f"item{n}"], [4])
        manager.can_allocate(request, 0, 100, 0)
        manager.free(request)
    manager.allocate(kept, 0)
    assert kept.size_calls == [1], "the kept request's size was read again"


def test_feature_list_items_are_kept_alive_only_by_the_records() -> None:
    manager = encoder_cache.EncoderCacheManager(100)
    feature = MultiModalFeature("a", PlaceholderRange(0, 4))
    request = make_request("r", [], [])
    request.mm_features.append(feature)
    schedule_one(manager, request, 0)
    gone = weakref.ref(feature)
    request.mm_features[0] = MultiModalFeature("a", PlaceholderRange(0, 4))
    del feature
    gc.collect()
    assert gone() is not None, "the records hold the feature they read"
    manager.free(request)
    gc.collect()
    assert gone() is None


def test_each_request_finds_its_own_record_as_requests_come_go_and_interleave() -> None:
    """A call finds its request's record in the slot the last call used, or
    by the request object; slots are reused as requests go, and renumbered
    once most are free. Every answer must still be its own request's, read
    from its record (each item read once)."""
    manager = encoder_cache.EncoderCacheManager(10**6)
    rng = random.Random(5)
    live: dict[str, CountingRequest] = {}
    made = 0
    for target in [300, 10, 250, 3, 120, 0]:
        while len(live) != target:
            if len(live) < target:
                size = 1 + made % 97
                request = CountingRequest(f"r{made}", [CountingFeature(f"item{made}", 0, size)])
                made += 1
                live[request.request_id] = request
                assert manager.can_allocate(request, 0, 10**6, 0)
                manager.allocate(request, 0)
            else:
                manager.free(live.pop(rng.choice(sorted(live))))
            for name in rng.sample(sorted(live), min(3, len(live))):
                request = live[name]
                size = request.mm_features[0].mm_position.length
                assert manager.get_cached_num_encoder_embeds(request, 0) == size, name
                assert manager.check_and_update_cache(request, 0), name
                assert manager.get_cached_input_ids(request) == {0}, name
                assert request.size_calls == [1], name
                assert request.mm_features[0].identifier_reads == 1, name
    assert made == 300 + (250 - 10) + (120 - 3)
    assert manager.num_freeable_slots == manager.cache_size, "every request freed its item"
