"""The Rust manager against the pure-Python one, under every eviction policy:
random scheduler-like call sequences (with waiting marks, resizes and
statistics), every return value, readable field, snapshot and counter
compared after every call, and the bookkeeping invariants checked on both."""

from __future__ import annotations

from conftest import make_request, state
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import encoder_cache
from encoder_cache import reference
from encoder_cache.request import MultiModalFeature, PlaceholderRange, Request

ITEMS = [f"img{i}" for i in range(8)]
# Mostly one size per item; the odd request disagrees, as a reused client UUID would.
SIZES = {item: 1 + 3 * i for i, item in enumerate(ITEMS)}


def outcome(call):
    """A call's return value, or the type of the exception it raised."""
    try:
        return ("ok", call())
    except Exception as exc:
        return ("raised", type(exc))


class DifferentialMachine(RuleBasedStateMachine):
    @initialize(
        cache_size=st.integers(0, 40),
        policy=st.sampled_from(encoder_cache.POLICIES),
        events=st.sampled_from([None, 0, 4, 1 << 16]),
    )
    def build(self, cache_size, policy, events):
        self.rust = encoder_cache.EncoderCacheManager(cache_size, policy=policy)
        self.python = reference.EncoderCacheManager(cache_size, policy=policy)
        self.requests = []
        self.count = 0
        self.kept = []  # sets the caller holds on to
        # Cache events: off, or on with a bound small enough to overflow. `seen`
        # is a subscriber's view, built from the drained events alone.
        self.events = events is not None
        self.seen = {}
        if self.events:
            self.both("enable_events", events)

    def both(self, method, *args):
        got = outcome(lambda: getattr(self.rust, method)(*args))
        want = outcome(lambda: getattr(self.python, method)(*args))
        assert got == want, (method, args)
        return want

    @rule(
        items=st.lists(st.sampled_from(ITEMS), min_size=1, max_size=6),
        odd=st.integers(0, 9),
        modality=st.sampled_from(["image", "video", "audio"]),
    )
    def new_request(self, items, odd, modality):
        sizes = [SIZES[item] for item in items]
        if odd == 0:
            sizes[0] += 1  # an identifier arriving with another embed count
        self.count += 1
        request = make_request(f"req{self.count}", items, sizes)
        request.mm_features[:] = [MultiModalFeature(f.identifier, f.mm_position, modality) for f in request.mm_features]
        self.requests.append(request)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def mark_waiting(self, data):
        """Lookahead: a waiting request's items are evicted last (a second mark is an error)."""
        self.both("mark_waiting", data.draw(st.sampled_from(self.requests)))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def unmark_waiting(self, data):
        self.both("unmark_waiting", data.draw(st.sampled_from(self.requests)))

    @rule(cache_size=st.integers(0, 60))
    def resize(self, cache_size):
        got = outcome(lambda: setattr(self.rust, "cache_size", cache_size))
        want = outcome(lambda: setattr(self.python, "cache_size", cache_size))
        assert got == want, ("resize", cache_size)

    @rule(chance=st.integers(0, 9))
    def reset_stats(self, chance):
        if chance == 0:
            self.both("reset_stats")

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), budget=st.integers(-2, 40), scheduled=st.integers(0, 20))
    def schedule_item(self, data, budget, scheduled):
        """What vLLM's scheduler does per item: hit, or check room and allocate."""
        request = data.draw(st.sampled_from(self.requests))
        input_id = data.draw(st.integers(0, len(request.mm_features) - 1))
        self.both("get_cached_num_encoder_embeds", request, input_id)
        if self.both("check_and_update_cache", request, input_id) == ("ok", False) and self.both(
            "can_allocate", request, input_id, budget, scheduled
        ) == ("ok", True):
            self.both("allocate", request, input_id)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), budget=st.integers(-2, 40), scheduled=st.integers(-5, 20))
    def can_allocate(self, data, budget, scheduled):
        request = data.draw(st.sampled_from(self.requests))
        self.both("can_allocate", request, data.draw(st.integers(0, len(request.mm_features))), budget, scheduled)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def allocate_blindly(self, data):
        request = data.draw(st.sampled_from(self.requests))
        self.both("allocate", request, data.draw(st.integers(-1, len(request.mm_features))))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_encoder_input(self, data):
        request = data.draw(st.sampled_from(self.requests))
        self.both("free_encoder_input", request, data.draw(st.integers(0, len(request.mm_features))))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data):
        request = data.draw(st.sampled_from(self.requests))
        self.both("get_cached_input_ids", request)
        self.both("free", request)

    @rule()
    def report_freed(self):
        self.both("get_freed_mm_hashes")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def grow_request(self, data):
        """Streaming sessions append items to a live request."""
        request = data.draw(st.sampled_from(self.requests))
        item = data.draw(st.sampled_from(ITEMS))
        last = request.mm_features[-1].mm_position
        request.mm_features.append(
            MultiModalFeature(item, PlaceholderRange(last.offset + last.length + 1, SIZES[item]))
        )

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), item=st.sampled_from(ITEMS), odd=st.integers(0, 4))
    def replace_item(self, data, item, odd):
        """An item object replaced in place (the Rust manager keeps what it read
        of the old object, and must see the new one)."""
        request = data.draw(st.sampled_from(self.requests))
        i = data.draw(st.integers(0, len(request.mm_features) - 1))
        old = request.mm_features[i].mm_position
        size = SIZES[item] + (odd == 0)
        request.mm_features[i] = MultiModalFeature(item, PlaceholderRange(old.offset, size))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def rebuild_request(self, data):
        """The same request id on a new object (what the Rust manager kept of
        the old object is not the new one's)."""
        i = data.draw(st.integers(0, len(self.requests) - 1))
        old = self.requests[i]
        self.requests[i] = Request(old.request_id, list(old.mm_features))

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), keep=st.booleans(), change=st.booleans())
    def cached_input_ids(self, data, keep, change):
        """The set handed out is the caller's: keeping or changing it changes
        nothing the manager returns later."""
        request = data.draw(st.sampled_from(self.requests))
        got = self.rust.get_cached_input_ids(request)
        assert got == self.python.get_cached_input_ids(request)
        if change:
            got.add(99)
        if keep:
            self.kept.append(got)

    @rule(drain=st.booleans())
    def take_step_events(self, drain):
        """A step's end: the freed report, then (usually) the events drained. Applied
        in order to the previous view, they give the cached items."""
        self.both("get_freed_mm_hashes")
        if not drain:
            return
        outcome = self.both("take_step_events")
        if not self.events:
            assert outcome == ("raised", ValueError)
            return
        cleared, removed, stored = outcome[1]
        if cleared:
            self.seen.clear()
        for mm_hash in removed:
            self.seen.pop(mm_hash, None)
        for mm_hash, embeds, modality in stored:
            self.seen[mm_hash] = (embeds, modality)
        assert self.seen == {h: (n, m) for h, n, m in self.rust.cached_items()}

    @rule(engine=st.integers(0, 300))
    def take_event_batch(self, engine):
        """A step's end drained as one batch: the same events from both, the
        same payload bytes (Rust writes them, the twin packs them with msgpack)."""
        self.both("get_freed_mm_hashes")
        got = outcome(self.rust.take_event_batch)
        want = outcome(self.python.take_event_batch)
        if not self.events:
            assert got == want == ("raised", ValueError)
            return
        rust, python = got[1], want[1]
        assert (rust is None) == (python is None)
        if rust is None:
            return
        assert (rust.cleared, rust.removed, rust.stored) == (python.cleared, python.removed, python.stored)
        assert rust.events() == python.events() and len(rust) == len(python)
        assert rust.encode(1.5e9, engine) == python.encode(1.5e9, engine)
        assert rust.events("CPU") == python.events("CPU")
        if rust.cleared:
            self.seen.clear()
        for mm_hash in rust.removed:
            self.seen.pop(mm_hash, None)
        for mm_hash, embeds, modality in rust.stored:
            self.seen[mm_hash] = (embeds, modality)
        assert self.seen == {h: (n, m) for h, n, m in self.rust.cached_items()}

    @rule(chance=st.integers(0, 19))
    def reset(self, chance):
        if chance == 0:
            self.both("reset")

    @invariant()
    def same_state_and_sound(self):
        assert state(self.rust) == state(self.python)
        assert self.rust.snapshot() == self.python.snapshot()
        assert self.rust.stats() == self.python.stats()
        assert self.rust.policy == self.python.policy
        assert self.rust.cached_items() == self.python.cached_items()
        self.rust.check_invariants()
        self.python.check_invariants()


DifferentialMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_rust_matches_python = DifferentialMachine.TestCase
