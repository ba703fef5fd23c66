"""Reliability of the managers: invariants after every operation, state dumps,
hostile request objects, panics, threads and reference counts.

Every property runs on the Rust managers and on the pure-Python reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import encoder_cache
from encoder_cache import InvariantError, MultiModalFeature, PlaceholderRange, Request, reference
from encoder_cache.invariants import RULES

#: Multiplies every property test's example count: a long fuzzing campaign is
#: `ENCODER_CACHE_FUZZ_SCALE=100 .venv/bin/python -m pytest tests/test_reliability.py`.
SCALE = int(os.environ.get("ENCODER_CACHE_FUZZ_SCALE", "1"))
RUST = encoder_cache.EncoderCacheManager
REF = reference.EncoderCacheManager
MANAGERS = [RUST, REF]
ENC_DEC = [encoder_cache.EncoderDecoderCacheManager, reference.EncoderDecoderCacheManager]
ITEMS = ["img0", "img1", "img2", "img3", "img4"]


def size_of(item: str) -> int:
    return 2 + 3 * ITEMS.index(item)


def make_request(request_id: str, items: list[str]) -> Request:
    features, offset = [], 0
    for item in items:
        features.append(MultiModalFeature(item, PlaceholderRange(offset, size_of(item))))
        offset += size_of(item) + 1
    return Request(request_id, features)


# -- operation sequences, run in lockstep on both implementations ------------

requests_st = st.lists(st.lists(st.sampled_from(ITEMS), min_size=1, max_size=4), min_size=1, max_size=4)
op_st = st.one_of(
    st.tuples(st.just("check_and_update_cache"), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("can_allocate"), st.integers(0, 3), st.integers(0, 4), st.integers(-2, 30), st.integers(-2, 20)),
    st.tuples(st.just("allocate"), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("free_encoder_input"), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("free"), st.integers(0, 3)),
    st.tuples(st.just("get_freed_mm_hashes")),
    st.tuples(st.just("restore")),
    st.tuples(st.just("mark_waiting"), st.integers(0, 3)),
    st.tuples(st.just("unmark_waiting"), st.integers(0, 3)),
    st.tuples(st.just("resize"), st.integers(0, 50)),
)


def run_op(manager, requests: list[Request], op: tuple):
    """Apply `op`; returns (manager, outcome) where outcome is the result or
    the exception type. `restore` swaps in a manager restored from a dump."""
    name, *args = op
    if name == "restore":
        return type(manager).restore(json.loads(json.dumps(manager.snapshot()))), None
    if name == "get_freed_mm_hashes":
        return manager, manager.get_freed_mm_hashes()
    if name == "resize":
        try:
            manager.cache_size = args[0]
        except ValueError as err:
            return manager, type(err)
        return manager, None
    request = requests[args[0] % len(requests)]
    try:
        return manager, getattr(manager, name)(request, *args[1:])
    except (ValueError, IndexError) as err:
        return manager, type(err)


policy_st = st.sampled_from(encoder_cache.POLICIES)


@settings(max_examples=150 * SCALE, deadline=None)
@given(cache_size=st.integers(0, 40), items=requests_st, ops=st.lists(op_st, max_size=60), policy=policy_st)
def test_lockstep_with_invariants_after_every_operation(cache_size, items, ops, policy):
    requests = [make_request(f"r{i}", its) for i, its in enumerate(items)]
    rust, ref = RUST(cache_size, policy=policy), REF(cache_size, policy=policy)
    for op in ops:
        before = rust.snapshot()
        rust, rust_out = run_op(rust, requests, op)
        ref, ref_out = run_op(ref, requests, op)
        assert rust_out == ref_out, op
        if isinstance(rust_out, type):  # refused: nothing changed
            assert rust.snapshot() == before, op
        rust.check_invariants()
        ref.check_invariants()
        assert rust.snapshot() == ref.snapshot(), op  # includes the eviction order


@settings(max_examples=60 * SCALE, deadline=None)
@given(cache_size=st.integers(0, 40), items=requests_st, ops=st.lists(op_st, max_size=40), policy=policy_st)
def test_snapshots_restore_across_implementations(cache_size, items, ops, policy):
    requests = [make_request(f"r{i}", its) for i, its in enumerate(items)]
    rust = RUST(cache_size, policy=policy)
    for op in ops:
        rust, _ = run_op(rust, requests, op)
    state = rust.snapshot()
    assert json.loads(json.dumps(state)) == state, "plain JSON-able data"
    via_ref = REF.restore(state)
    assert via_ref.snapshot() == state
    back = RUST.restore(via_ref.snapshot())
    assert back.snapshot() == state
    # Readable state agrees too, not only the dumps.
    for attr in ("cached", "num_embeds_by_hash", "request_cached_ids", "request_hash_refs", "freed"):
        assert getattr(back, attr) == getattr(via_ref, attr) == getattr(rust, attr), attr
    assert list(back.freeable.items()) == list(via_ref.freeable.items()) == list(rust.freeable.items())


def test_snapshot_is_a_copy():
    manager = RUST(10)
    manager.allocate(make_request("r", ["img0"]), 0)
    state = manager.snapshot()
    state["entries"]["img0"]["referrers"].append("ghost")
    manager.check_invariants()
    assert manager.snapshot()["entries"]["img0"]["referrers"] == ["r"]


class Tagged(RUST):
    pass


@pytest.mark.parametrize("cls", [Tagged, type("TaggedRef", (REF,), {})])
def test_restore_builds_the_subclass(cls):
    assert type(cls.restore(cls(5).snapshot())) is cls


@pytest.mark.parametrize("cls", ENC_DEC)
def test_encoder_decoder_snapshot_round_trip(cls):
    manager = cls(20)
    request = make_request("r", ["img1", "img2"])
    manager.allocate(request, 0)
    manager.get_freed_mm_hashes()
    manager.allocate(request, 1)
    manager.free_encoder_input(request, 0)
    manager.free_encoder_input(request, 0)  # freed once: vLLM 0.33 would add its size back twice
    manager.check_invariants()
    state = manager.snapshot()
    assert state == {
        "cache_size": 20,
        "num_free_slots": 20 - 8,
        "held": {"r": [[1, 8]]},
        "allocated": ["img2"],
        "to_free": ["img1"],
    }
    for other in ENC_DEC:
        restored = other.restore(json.loads(json.dumps(state)))
        assert restored.snapshot() == state
        assert restored.get_freed_mm_hashes() == ["img1"]


def valid_state() -> dict:
    """r0 holds img0 twice and img1; r1 holds img1; img2 is freeable. 15 of 40 slots cached."""
    manager = RUST(40)
    r0, r1, r2 = (
        make_request("r0", ["img0", "img1", "img0"]),
        make_request("r1", ["img1"]),
        make_request("r2", ["img2"]),
    )
    manager.allocate(r0, 0)
    manager.allocate(r0, 1)
    manager.check_and_update_cache(r0, 2)
    manager.check_and_update_cache(r1, 0)
    manager.allocate(r2, 0)
    manager.free(r2)
    return manager.snapshot()


def corrupt(path: str, value):
    state = valid_state()
    *parents, last = path.split("/")
    node = state
    for key in parents:
        node = node[int(key) if isinstance(node, list) else key]
    node[int(last) if isinstance(node, list) else last] = value
    return state


CORRUPTIONS = [
    ("num_free_slots", 3, RULES[0], "3 free + 15 cached != 40"),
    ("freeable/0/1", 5, RULES[1], "freeable item 'img2' has size 5, cached size 8"),
    ("freeable", [], RULES[1], "unreferenced item 'img2' is not freeable"),
    ("freeable", [["img2", 8], ["img2", 8]], RULES[1], "item 'img2' is listed twice"),
    ("freeable", [["img2", 8], ["img0", 2]], RULES[1], "freeable item 'img0' is referenced by 1 requests"),
    ("freeable", [["img2", 8], ["img9", 2]], RULES[1], "freeable item 'img9' is not cached"),
    ("num_freeable_slots", 30, RULES[2], "30 freeable != 25 free + 8 freeable"),
    ("requests/r0/occurrences/img0", 1, RULES[3], "request 'r0' counts item 'img0' 1 times but holds it at 2 inputs"),
    ("requests/r1/inputs", [], RULES[3], "request 'r1' holds no inputs but is recorded"),
    (
        "entries/img0/referrers",
        ["r0", "r1"],
        RULES[4],
        "item 'img0' is referenced by request 'r1', which does not count it",
    ),
    ("entries/img1/referrers", ["r0"], RULES[5], "request 'r1' counts item 'img1' but is not among its referrers"),
]


@pytest.mark.parametrize("cls", MANAGERS)
@pytest.mark.parametrize(("path", "value", "rule", "detail"), CORRUPTIONS)
def test_restore_refuses_each_broken_rule_with_the_same_message(cls, path, value, rule, detail):
    with pytest.raises(ValueError) as excinfo:
        cls.restore(corrupt(path, value))
    assert str(excinfo.value) == f"inconsistent state: {rule}: {detail}"


def test_every_rule_is_covered_by_a_corruption():
    assert {rule for *_, rule, _ in CORRUPTIONS} == set(RULES)


def test_invariant_error_names_the_rule_on_a_live_manager():
    manager = REF.restore(valid_state())
    manager.check_invariants()
    manager.num_free_slots += 1
    with pytest.raises(InvariantError, match="^free \\+ cached sizes equal cache_size: 26 free"):
        manager.check_invariants()
    assert issubclass(InvariantError, AssertionError)


@pytest.mark.parametrize("cls", MANAGERS)
@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("cache_size", -1, ValueError),
        ("cache_size", 2**64, ValueError),
        ("cache_size", True, TypeError),
        ("cache_size", "40", TypeError),
        ("entries/img0/num_embeds", 2.0, TypeError),
        ("entries/img0/referrers", "r0", TypeError),
        ("entries/img0", {"num_embeds": 2}, ValueError),
        ("freeable/0", ["img2"], ValueError),
        ("freeable/0", ["img2", 8, 1], ValueError),
        ("requests/r0/inputs/0", [0, 7], TypeError),
        ("requests/r0/occurrences/img0", 2**32, ValueError),
        ("freed", [None], TypeError),
    ],
)
def test_restore_refuses_malformed_states(cls, path, value, error):
    with pytest.raises(error):
        cls.restore(corrupt(path, value))


@pytest.mark.parametrize("cls", MANAGERS + ENC_DEC)
def test_restore_refuses_wrong_shapes(cls):
    with pytest.raises(TypeError):
        cls.restore("not a dict")
    with pytest.raises(ValueError, match="no 'num_free_slots' key|exactly the keys"):
        cls.restore({"cache_size": 4})
    other_kind = valid_state() if cls in ENC_DEC else ENC_DEC[0](4).snapshot()
    with pytest.raises(ValueError):
        cls.restore(other_kind)


# -- hostile request objects ------------------------------------------------


class Hostile(Exception):
    """Raised on purpose by a hostile request."""


#: What a well-behaved caller may see; pyo3's PanicException (a BaseException) is not among them.
CLEAR_ERRORS = (TypeError, ValueError, LookupError, AttributeError, RuntimeError, Hostile)


class Shifty:
    """A value that is different on each read."""

    def __init__(self, *values):
        self.values, self.reads = values, 0

    def next(self):
        value = self.values[self.reads % len(self.values)]
        self.reads += 1
        if isinstance(value, BaseException):
            raise value
        return value


class HostileFeature:
    def __init__(self, identifier: Shifty, position: PlaceholderRange):
        self._identifier, self.mm_position = identifier, position

    @property
    def identifier(self):
        return self._identifier.next()


class HostileRequest:
    """A request whose attributes raise, change type or value between reads,
    or call back into the manager."""

    def __init__(self, request_id: Shifty, features: Shifty, embeds: Shifty):
        self._request_id, self._features, self._embeds = request_id, features, embeds
        self._callback = lambda: None  # set by each call

    @property
    def request_id(self):
        return self._request_id.next()

    @property
    def mm_features(self):
        return self._features.next()

    def get_num_encoder_embeds(self, input_id):
        self._callback()
        return self._embeds.next()


def hostile_values(good, *bad):
    return st.lists(st.sampled_from([good, *bad]), min_size=1, max_size=3).map(lambda vs: Shifty(*vs))


def features_of(items):
    return [HostileFeature(Shifty(item), PlaceholderRange(3 * i, size_of(item))) for i, item in enumerate(items)]


class ExplodingList(list):
    def __getitem__(self, index):
        raise Hostile("mm_features[i]")


hostile_request_st = st.builds(
    HostileRequest,
    request_id=hostile_values("h0", "h1", Hostile("request_id"), 7, None, b"h0"),
    features=st.lists(st.lists(st.sampled_from(ITEMS), max_size=3), min_size=1, max_size=3).flatmap(
        lambda lists: hostile_values(
            features_of(lists[0]),
            *(features_of(items) for items in lists[1:]),
            Hostile("mm_features"),
            None,
            tuple(features_of(lists[0])),
            ExplodingList(features_of(lists[0])),
            [HostileFeature(Shifty("img0", 7, Hostile("identifier")), PlaceholderRange(0, 2))],
        )
    ),
    embeds=hostile_values(2, 5, 8, 11, 14, -1, True, 2.0, 2**70, "3", Hostile("get_num_encoder_embeds")),
)

ATOMIC_OPS = [
    "check_and_update_cache",
    "get_cached_num_encoder_embeds",
    "can_allocate",
    "allocate",
    "get_cached_input_ids",
    "free_encoder_input",
    "free",
    "allocate_encoder_inputs",  # one input: all or nothing
    "mark_waiting",
    "unmark_waiting",
]
#: A step walks the request's items like vLLM's loop: hits taken before a
#: failing item stay, so only soundness is required of it, not atomicity.
STEP_OPS = ["try_schedule_encoder_inputs", "free_encoder_inputs_before"]
CALLBACKS = ["none", "free", "allocate", "snapshot", "check_invariants", "restore_reset"]


def run_hostile(manager, request, op: str, input_id: int, callback: str, expected: list):
    """Call `op` with `request`; `expected[0]` tracks the state the manager
    must be in if the call fails: the state after the request's own callback
    (re-entrant calls are allowed to change it)."""

    def reenter():
        if callback == "free":
            manager.free(make_request("r0", ["img0"]))
        elif callback == "allocate":
            if manager.can_allocate(make_request("cb", ["img4"]), 0, 100, 0):
                manager.allocate(make_request("cb", ["img4"]), 0)
        elif callback == "snapshot":
            manager.snapshot()
        elif callback == "check_invariants":
            manager.check_invariants()
        elif callback == "restore_reset":
            manager.reset()
        expected[0] = manager.snapshot()

    def remote(identifier):
        reenter()
        return identifier == "img1"

    request._callback = reenter
    if op == "try_schedule_encoder_inputs":
        return manager.try_schedule_encoder_inputs(request, 3 * input_id, 10, 20, has_remote_item=remote)
    args = {
        "check_and_update_cache": (request, input_id),
        "get_cached_num_encoder_embeds": (request, input_id),
        "can_allocate": (request, input_id, 20, 0),
        "allocate": (request, input_id),
        "get_cached_input_ids": (request,),
        "mark_waiting": (request,),
        "unmark_waiting": (request,),
        "free_encoder_input": (request, input_id),
        "free": (request,),
        "allocate_encoder_inputs": (request, [input_id], []),
        "free_encoder_inputs_before": (request, 20),
    }[op]
    return getattr(manager, op)(*args)


@pytest.mark.parametrize("cls", MANAGERS + ENC_DEC)
@settings(max_examples=300 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    warmup=st.lists(
        st.tuples(st.sampled_from(["allocate", "check_and_update_cache", "free"]), st.integers(0, 2)), max_size=8
    ),
    calls=st.lists(
        st.tuples(
            hostile_request_st,
            st.sampled_from(ATOMIC_OPS + STEP_OPS),
            st.integers(-1, 3),
            st.sampled_from(CALLBACKS),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_hostile_requests_raise_clear_errors_and_change_nothing(cls, warmup, calls):
    manager = cls(30)
    normal = [make_request("r0", ["img0", "img1"]), make_request("r1", ["img1", "img0", "img1"])]
    for op, i in warmup:
        request = normal[i % 2]
        i %= len(request.mm_features)
        if op == "free":
            manager.free(request)
        elif manager.get_cached_num_encoder_embeds(request, i) is None:
            if i not in manager.get_cached_input_ids(request) and manager.can_allocate(request, i, 100, 0):
                manager.allocate(request, i)
        else:
            manager.check_and_update_cache(request, i)
    for request, op, input_id, callback in calls:
        expected = [manager.snapshot()]
        try:
            run_hostile(manager, request, op, input_id, callback, expected)
        except BaseException as err:
            event(f"{op} raised {type(err).__name__}")
            assert isinstance(err, CLEAR_ERRORS), f"{op} raised {type(err).__mro__}: {err}"
            if op in ATOMIC_OPS:
                assert manager.snapshot() == expected[0], f"failed {op} changed the state: {err!r}"
        manager.check_invariants()


@pytest.mark.parametrize("cls", MANAGERS)
def test_reentrant_read_runs_before_the_manager_is_borrowed(cls):
    """Every method reads the request before touching the state, so a request
    attribute that calls back into the manager meets a consistent manager."""
    manager = cls(10)
    owner = make_request("r0", ["img0"])
    manager.allocate(owner, 0)

    class Reentrant:
        @property
        def request_id(self):
            manager.free(owner)
            return "r0"

    assert manager.get_cached_input_ids(Reentrant()) == set()
    assert manager.freeable == {"img0": 2}
    manager.check_invariants()


@pytest.mark.parametrize("reenter", ["free", "snapshot"])
def test_has_remote_item_reentering_the_manager_gets_a_clear_error(reenter):
    """`has_remote_item` is consulted mid-walk, with the state borrowed: a
    callback that calls back into the manager, to change it (`free`) or to
    read it (`snapshot`), is refused, and the refusal leaves the manager usable."""
    manager = RUST(40)
    request = make_request("r", ["img0", "img1"])

    def remote(identifier):
        getattr(manager, reenter)(*([request] if reenter == "free" else []))
        return False

    with pytest.raises(RuntimeError, match="(?i)borrow"):
        manager.try_schedule_encoder_inputs(request, 0, 100, 100, has_remote_item=remote)
    manager.check_invariants()


def test_feature_changed_under_a_held_input_is_refused():
    for cls in MANAGERS:
        manager = cls(20)
        request = make_request("r", ["img0", "img1"])
        manager.allocate(request, 0)
        other = make_request("o", ["img1"])
        manager.allocate(other, 0)
        request.mm_features[0] = other.mm_features[0]  # input 0 now claims img1
        before = manager.snapshot()
        with pytest.raises(ValueError, match="already holds input 0 as item 'img0', not 'img1'"):
            manager.check_and_update_cache(request, 0)
        with pytest.raises(ValueError):
            manager.allocate(request, 0)
        assert manager.snapshot() == before
        manager.free_encoder_input(request, 0)  # frees what it held: img0
        assert manager.freeable == {"img0": 2}
        manager.check_invariants()


# -- panics ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"), [("_core._panic_for_test()", "deliberate panic from encoder_cache._core._panic_for_test")]
)
def test_a_rust_panic_surfaces_as_an_exception_not_an_abort(call, message):
    code = textwrap.dedent(
        f"""
        import encoder_cache
        from encoder_cache import _core
        try:
            {call}
        except BaseException as err:
            print(type(err).__name__, "|", err)
        manager = encoder_cache.EncoderCacheManager(4)  # the interpreter goes on
        manager.check_invariants()
        print("alive")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"the process died: returncode {proc.returncode}\n{proc.stderr}"
    assert proc.stdout.splitlines() == [f"PanicException | {message}", "alive"]


# -- threads -----------------------------------------------------------------


class SlowRequest:
    """A request whose reads run Python code, so threads switch mid-call."""

    def __init__(self, request: Request):
        self._request = request

    @property
    def request_id(self):
        return self._request.request_id

    @property
    def mm_features(self):
        return self._request.mm_features

    def get_num_encoder_embeds(self, input_id):
        return self._request.get_num_encoder_embeds(input_id)


def test_threads_hammering_one_manager_serialise():
    """The Rust manager only: the pure-Python reference is a single-threaded
    oracle (a thread switch between two of its statements can break it).

    Scheduler-like churn from several threads, sharing items, with a tiny
    switch interval and requests whose reads run Python code. Calls serialise:
    no error at all (each call reads its request before borrowing the state,
    and holds the borrow only while no Python code runs), and the state is
    sound and fully released at the end."""
    manager = RUST(60)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(t: int):
        barrier.wait()
        try:
            for step in range(300):
                items = [ITEMS[(t + step + k) % len(ITEMS)] for k in range(3)]
                request = SlowRequest(make_request(f"t{t}-{step}", items))
                for i in range(len(items)):
                    if manager.check_and_update_cache(request, i) or not manager.can_allocate(request, i, 100, 0):
                        continue
                    try:
                        manager.allocate(request, i)
                    except ValueError:
                        # Another thread cached it, or took the room, between our calls:
                        # the caller's race, refused cleanly. Take the hit if there is one.
                        manager.check_and_update_cache(request, i)
                assert manager.get_cached_input_ids(request) <= {0, 1, 2}
                manager.free(request)
                if step % 7 == 0:
                    manager.get_freed_mm_hashes()
                    manager.snapshot()
        except BaseException as err:
            errors.append(err)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    manager.check_invariants()
    assert manager.request_cached_ids == {}
    assert all(not referrers for referrers in manager.cached.values())
    assert manager.num_freeable_slots == manager.cache_size


# -- reference counts ----------------------------------------------------------


@pytest.mark.parametrize("cls", MANAGERS)
def test_no_reference_leaks_on_requests_or_returned_objects(cls):
    manager = cls(12)
    request = make_request("leak-check", ["img0", "img1", "img0"])
    ids = [request, request.request_id, request.mm_features, *request.mm_features]
    ids += [f.identifier for f in request.mm_features]

    def churn():
        for _ in range(200):
            for i in range(3):
                if not manager.check_and_update_cache(request, i) and manager.can_allocate(request, i, 50, 0):
                    manager.allocate(request, i)
            manager.get_cached_num_encoder_embeds(request, 0)
            manager.get_cached_input_ids(request)
            manager.free_encoder_input(request, 1)
            manager.free(request)
            to_encode, _, _, _, repeated = manager.try_schedule_encoder_inputs(request, 0, 100, 50)
            manager.allocate_encoder_inputs(request, to_encode, repeated)
            manager.free_encoder_inputs_before(request, 3)
            manager.free(request)  # drops the step API's records of the request
            manager.get_freed_mm_hashes()
            manager.snapshot()

    churn()  # warm up caches (interned strings, the reference's dicts)
    before = [sys.getrefcount(obj) for obj in ids]
    churn()
    assert [sys.getrefcount(obj) for obj in ids] == before
    freed = manager.get_freed_mm_hashes()
    assert sys.getrefcount(freed) == 2  # only `freed` and the call's argument
    state = manager.snapshot()
    assert sys.getrefcount(state) == 2
