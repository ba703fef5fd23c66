"""Routing across replicas (``simulate --replicas``): each routing choice's
behaviour, the exact-event indexes (encoder cache and KV blocks) against the
replicas' caches, the CLI's errors."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path

import pytest

from encoder_cache.__main__ import main
from encoder_cache.events.index import CacheIndex
from encoder_cache.simulator.cluster import Cluster, simulate_routing
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.engine import simulate
from encoder_cache.simulator.kv_events import BLOCK_REMOVED, BLOCK_STORED, EventedPool, KvBlockIndex, PromptHashes
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE
from encoder_cache.simulator.routers import ROUTINGS, LruGuess, make_router, spared_embeds
from encoder_cache.simulator.spec import Item, ItemSegment, RequestSpec, Text
from encoder_cache.simulator.trace import TraceWorkload
from encoder_cache.simulator.variants import Variant
from encoder_cache.simulator.workloads import WorkloadConfig, generate

LIMITS = SchedulerLimits()


def spec(request_id: str, *items: tuple[str, int], session: str | None = None) -> RequestSpec:
    laid, offset = [], 4
    for identifier, embeds in items:
        laid.append(Item(identifier, offset + 1, embeds, "image"))
        offset += embeds + 2
    return RequestSpec(request_id, 0, session, None, offset + 8, 4, tuple(laid))


def trace(tmp_path: Path, lines: list[tuple[float, list[tuple[str, int]]]]) -> TraceWorkload:
    """A trace of one-off requests: (time, [(item, embeds), ...]), each with text of its own.
    An item named ``text:KEY`` with N embeds stands for N tokens of shared text KEY."""
    path = tmp_path / "t.jsonl"
    with path.open("w") as handle:
        for n, (t, items) in enumerate(lines):
            prompt = [
                {"text": i[5:], "tokens": e} if i.startswith("text:") else {"id": i, "embeds": e} for i, e in items
            ]
            prompt.append({"tokens": 20})
            handle.write(json.dumps({"t": t, "session": None, "id": f"r{n}", "output_tokens": 4, "prompt": prompt}))
            handle.write("\n")
    return TraceWorkload(str(path), 1.0)


# --- the routers alone -----------------------------------------------------------


def test_round_robin_takes_the_replicas_in_turn_whatever_their_load():
    router = make_router("round-robin", 3, CacheIndex())
    assert [router.choose(spec(f"r{n}"), [9, 0, 0]) for n in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_picks_the_fewest_requests_and_rotates_ties():
    router = make_router("least-loaded", 3, CacheIndex())
    assert router.choose(spec("a"), [5, 2, 7]) == 1
    assert {router.choose(spec(f"t{n}"), [1, 1, 1]) for n in range(3)} == {0, 1, 2}


def test_cache_aware_scores_by_the_exact_index_and_yields_to_load():
    index = CacheIndex()
    index.apply_events(1, 0, [{"type": "EncoderCacheStored", "hash": "x", "embeds": 500, "modality": "image"}])
    router = make_router("cache-aware", 3, index, slack=4)
    request = spec("a", ("x", 500), ("y", 100))
    assert router.choose(request, [0, 3, 0]) == 1, "it holds 500 of the request's embeddings"
    assert router.choose(request, [0, 5, 0]) != 1, "more than 4 requests above the least loaded: overloaded"
    index.apply_events(1, 1, [{"type": "EncoderCacheRemoved", "hashes": ["x"]}])
    assert router.choose(request, [2, 0, 1]) == 1, "nothing cached anywhere: the least loaded"


def test_lru_guess_records_placements_evicts_the_oldest_and_never_hears_of_evictions():
    guess = LruGuess(2, slack=100, entries=2)
    for n, item in enumerate(["a", "b", "c"]):
        guess.placed(spec(f"r{n}", (item, 10)), 0)
    assert list(guess.lru[0]) == ["b", "c"], "2 entries: the oldest placement is forgotten"
    assert guess.choose(spec("q", ("c", 10)), [0, 0]) == 0
    assert guess.believes(0, "c") and not guess.believes(1, "c")
    assert isinstance(guess.lru[0], OrderedDict)


def test_spared_embeds_counts_items_inside_the_kv_prefix_and_in_the_encoder_cache():
    request = spec("a", ("x", 100), ("y", 200), ("z", 50))  # x ends at 105, y at 307, z at 360
    assert spared_embeds(request, 0, set()) == 0
    assert spared_embeds(request, 112, set()) == 100, "x's placeholders lie in the prefix"
    assert spared_embeds(request, 304, set()) == 100, "y is covered only in part: it is encoded whole"
    assert spared_embeds(request, 304, {"z"}) == 150, "z is in the encoder cache"
    assert spared_embeds(request, 400, {"x"}) == 350, "each item counts once"
    twice = RequestSpec("b", 0, None, None, 400, 4, (Item("x", 5, 100, "image"), Item("x", 200, 100, "image")))
    assert spared_embeds(twice, 160, set()) == 0, "its second occurrence lies past the prefix"


def _kv_index(replicas: int, stored: dict[int, list[int]]) -> KvBlockIndex:
    kv = KvBlockIndex(replicas)
    for replica, hashes in stored.items():
        kv.apply(replica, [(BLOCK_STORED, h) for h in hashes])
    return kv


def test_cache_aware_kv_scores_the_work_each_replica_would_spare():
    # Shared text, then x (16 embeds), y (100) and the question: replica 1 holds the prefix through x,
    # replica 2 holds y in its encoder cache.
    segments = (Text("sys", 31), ItemSegment("x", 16), ItemSegment("y", 100), Text(("q", 0), 40))
    request = RequestSpec.described("q", 0, None, None, segments, 4)
    hashes = PromptHashes().of(request)
    assert len(hashes) == (request.prompt_tokens - 1) // BLOCK_SIZE
    index = CacheIndex()
    index.apply_events(2, 0, [{"type": "EncoderCacheStored", "hash": "y", "embeds": 100, "modality": "image"}])
    kv = _kv_index(3, {0: hashes[:2], 1: hashes[:3]})  # 0 holds 32 tokens: x ends at 48; 1 holds 48
    router = make_router("cache-aware+kv", 3, index, kv=kv, hashes=PromptHashes(), slack=4)
    assert router.held(request, {"x": 16, "y": 100}) == [0, 16, 100]
    assert router.choose(request, [0, 0, 0]) == 2
    kv.apply(1, [(BLOCK_STORED, h) for h in hashes[3:]])
    assert kv.prefix_blocks(1, hashes) == len(hashes)
    assert router.held(request, {"x": 16, "y": 100}) == [0, 116, 100]
    assert router.choose(request, [0, 3, 0]) == 1, "its whole prefix: both items spared"
    assert router.choose(request, [0, 5, 0]) == 2, "overloaded: the encoder cache's replica"
    with pytest.raises(ValueError, match="cache-aware\\+kv needs the replicas' KV block index"):
        make_router("cache-aware+kv", 3, index)


def test_the_kv_index_counts_blocks_per_hash_and_a_prefix_stops_at_the_first_gap():
    kv = _kv_index(1, {0: [1, 2, 3, 2]})
    kv.apply(0, [(BLOCK_REMOVED, 2)])
    assert kv.blocks[0] == {1: 1, 2: 1, 3: 1}, "a second block still holds 2"
    kv.apply(0, [(BLOCK_REMOVED, 2)])
    assert kv.prefix_blocks(0, [1, 2, 3]) == 1 and kv.prefix_tokens(0, [1, 3]) == 2 * BLOCK_SIZE
    kv.apply(0, [("AllBlocksCleared", None)])
    assert kv.blocks[0] == {}


def test_the_evented_pool_publishes_what_it_keys_and_unkeys():
    pool = EventedPool(4, caching=True)
    a, b = pool.allocate(2)
    pool.cache(a, 11)
    pool.cache(a, 12)  # already keyed: nothing
    pool.cache(b, 11)  # a second block with the same hash
    pool.release([a, b])
    pool.allocate(3)  # hands out the free block first, then both keyed ones
    assert pool.take_events() == [(BLOCK_STORED, 11), (BLOCK_STORED, 11), (BLOCK_REMOVED, 11), (BLOCK_REMOVED, 11)]
    assert pool.take_events() == [] and pool.cached_hashes() == {}


# --- whole runs --------------------------------------------------------------------


@pytest.mark.parametrize("routing", ROUTINGS)
def test_one_replica_is_the_single_engine_run_exactly(routing):
    """Whatever the router, one replica replays exactly what the model replays
    alone: the windows and the pause at ``until`` change nothing."""
    workload = generate(WorkloadConfig(kind="mix", requests=150, seed=3))
    alone = simulate(workload, LIMITS, Variant())
    routed = simulate_routing(workload, LIMITS, Variant(), 1, routing)
    assert asdict(routed.counters) == asdict(alone.counters)
    assert routed.load_imbalance == 1.0


def test_round_robin_spreads_requests_evenly():
    workload = generate(WorkloadConfig(kind="popular", requests=203))
    result = simulate_routing(workload, LIMITS, Variant(), 4, "round-robin", sticky=False)
    counts = [r.requests for r in result.per_replica]
    assert sum(counts) == 203 and max(counts) - min(counts) <= 1


def test_sticky_sessions_keep_every_turn_on_one_replica():
    workload = generate(WorkloadConfig(kind="chat", requests=120))
    sticky = simulate_routing(workload, LIMITS, Variant(), 3, "round-robin")
    loose = simulate_routing(workload, LIMITS, Variant(), 3, "round-robin", sticky=False)
    assert sticky.sticky_placements > 0 and loose.sticky_placements == 0
    assert sticky.counters.requests == loose.counters.requests == 120
    # A turn away from its session's replica finds no KV prefix there: more tokens looked up miss.
    assert sticky.counters.prefix_hit_tokens > loose.counters.prefix_hit_tokens


def test_cache_aware_sends_a_repeated_item_to_the_replica_that_holds_it(tmp_path):
    # x lands on replica 0, y on 1, z on 0; x comes back when round-robin's turn is replica 1.
    workload = trace(tmp_path, [(0, [("x", 1000)]), (1, [("y", 600)]), (2, [("z", 700)]), (60, [("x", 1000)])])
    aware = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware")
    rr = simulate_routing(workload, LIMITS, Variant(), 2, "round-robin")
    assert [r.requests for r in aware.per_replica] == [3, 1]
    assert aware.counters.encoded_embeds == 1000 + 600 + 700, "x is encoded once"
    assert aware.placed_cached_embeds == 1000
    assert rr.counters.encoded_embeds == 2 * 1000 + 600 + 700, "round-robin encodes x again on replica 1"


def test_placements_in_flight_keep_a_new_item_together_before_any_event_says_so(tmp_path):
    # Two requests for a new image in the same step: no replica has stored it yet.
    workload = trace(tmp_path, [(0, [("x", 1000)]), (0, [("x", 1000)])])
    aware = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware")
    placed = Cluster(
        workload,
        LIMITS,
        Variant(),
        2,
        "cache-aware+placed",
        cache_size=None,
        cost=EncoderCost(),
        sticky=True,
        check=False,
        router_options={},
    )
    result = placed.run()
    assert [r.requests for r in aware.per_replica] == [1, 1] and aware.counters.encoded_embeds == 2000
    assert [r.requests for r in result.per_replica] == [2, 0] and result.counters.encoded_embeds == 1000
    assert placed.router.in_flight == [{}, {}], "every placement is forgotten once its request finished"


def test_the_lru_guess_is_wrong_after_an_eviction_and_the_events_are_not(tmp_path):
    # A cache of one item per replica: w on replica 0 evicts x, which the guess still places there.
    workload = trace(tmp_path, [(0, [("x", 1000)]), (10, [("v", 1000)]), (20, [("w", 1000)]), (40, [("x", 1000)])])
    guess = simulate_routing(workload, LIMITS, Variant(), 2, "lru-guess", cache_size=1000)
    aware = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware", cache_size=1000)
    assert guess.believed_embeds == 1000 and guess.believed_true_embeds == 0, "it believed x was still on replica 0"
    assert guess.guess_precision == 0.0
    assert aware.believed_embeds == 0, "the events said x was gone: no replica held it"
    assert guess.counters.encoded_embeds == aware.counters.encoded_embeds == 4000


def test_on_popular_traffic_the_guess_is_often_wrong_and_the_events_never():
    workload = generate(WorkloadConfig(kind="popular", requests=300))
    guess = simulate_routing(workload, LIMITS, Variant(), 4, "lru-guess")
    aware = simulate_routing(workload, LIMITS, Variant(), 4, "cache-aware")
    assert guess.guess_precision is not None and guess.guess_precision < 0.9
    assert aware.guess_precision == 1.0
    assert aware.placed_cached_embeds > guess.placed_cached_embeds


def test_cache_aware_kv_sends_a_request_to_the_replica_with_its_kv_prefix(tmp_path):
    # x and x2 (a two-frame video) on replica 0; y on 1; z on 0 evicts both frames from its
    # one-item encoder cache, while its KV cache keeps the prefix. The question comes back when
    # round-robin's turn is replica 1.
    video = [("x", 1000), ("x2", 1000)]
    lines = [(0, video), (1, [("y", 1000)]), (2, [("z", 1000)]), (60, video)]
    workload = trace(tmp_path, lines)
    kv = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware+kv", cache_size=1000)
    aware = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware", cache_size=1000)
    assert [r.requests for r in kv.per_replica] == [3, 1]
    assert kv.counters.encoded_embeds == 2000 + 1000 + 1000 + 1000, "x is spared by the prefix, x2 encoded again"
    assert kv.placed_spared_embeds == 1000 and kv.placed_cached_embeds == 0
    assert [r.requests for r in aware.per_replica] == [2, 2], "no encoder cache holds x: by load and turn"
    assert aware.counters.encoded_embeds == 2 * 2000 + 2000


def test_a_shared_text_prefix_alone_does_not_attract_a_request(tmp_path):
    # Every replica holds the system prompt; the request's item is new: routed by load and turn.
    workload = trace(tmp_path, [(0, [("text:sys", 64), ("x", 500)]), (1, [("text:sys", 64), ("y", 500)])])
    kv = simulate_routing(workload, LIMITS, Variant(), 2, "cache-aware+kv")
    assert [r.requests for r in kv.per_replica] == [1, 1] and kv.placed_spared_embeds == 0


class _KvWatched(Cluster):
    """Checks, at every routing decision, that the KV index is each replica's pool's cached hashes."""

    checked = 0
    removed = 0

    def route(self, spec, clock):
        for r, run in enumerate(self.runs):
            assert self.kv.blocks[r] == run.pool.cached_hashes(), (r, clock)
        type(self).checked += 1
        super().route(spec, clock)

    def _publish_kv_events(self):
        for run in self.runs:
            type(self).removed += sum(kind == BLOCK_REMOVED for kind, _ in run.pool.events)
        super()._publish_kv_events()


@pytest.mark.parametrize(
    ("kind", "routing", "kv_capacity"),
    [("mix", "cache-aware+kv", 262_144), ("mix", "round-robin", 16_384), ("chat", "cache-aware+kv", 16_384)],
)
def test_the_kv_index_equals_every_replicas_cached_blocks_at_every_decision(kind, routing, kv_capacity):
    workload = generate(WorkloadConfig(kind=kind, requests=150, seed=2))
    limits = SchedulerLimits(kv_capacity=kv_capacity)
    cluster = _KvWatched(
        workload,
        limits,
        Variant(),
        3,
        routing,
        cache_size=None,
        cost=EncoderCost(),
        sticky=True,
        check=False,
        router_options={},
    )
    _KvWatched.checked = _KvWatched.removed = 0
    result = cluster.run()
    assert _KvWatched.checked == 150 and result.counters.requests == 150
    for r, run in enumerate(cluster.runs):
        assert cluster.kv.blocks[r] == run.pool.cached_hashes() != {}
    assert (_KvWatched.removed > 0) == (kv_capacity < 262_144), "a small KV cache evicts blocks"
    # The requests' hashes are the ones the replicas key: their prefixes cover items.
    assert result.placed_spared_embeds > result.placed_cached_embeds


class _Watched(Cluster):
    """Checks, at every routing decision, that the router's index is each replica's cache."""

    checked = 0

    def route(self, spec, clock):
        for r, manager in enumerate(self.managers):
            held = {h: e for h, (e, _) in self.index.engine(r).items.items()}
            assert held == dict(manager.num_embeds_by_hash), (r, clock)
        type(self).checked += 1
        super().route(spec, clock)


@pytest.mark.parametrize("policy", ["vllm", "s3fifo"])
def test_the_event_index_equals_every_replicas_cache_at_every_decision(policy):
    workload = generate(WorkloadConfig(kind="mix", requests=200, seed=5))
    cluster = _Watched(
        workload,
        LIMITS,
        Variant(policy),
        3,
        "cache-aware",
        cache_size=4096,
        cost=EncoderCost(),
        sticky=True,
        check=True,
        router_options={},
    )
    result = cluster.run()
    assert _Watched.checked >= 200 and result.counters.requests == 200
    for r, manager in enumerate(cluster.managers):
        assert {h: e for h, (e, _) in cluster.index.engine(r).items.items()} == dict(manager.num_embeds_by_hash)


# --- the command line ---------------------------------------------------------------

FAST = ["simulate", "--requests", "40", "--no-progress", "--workload", "popular"]


def test_the_routing_table_and_its_json(capsys):
    assert main([*FAST, "--replicas", "3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines() if line.split()[:1] and line.split()[0] in ROUTINGS}
    assert rows == set(ROUTINGS)
    assert "cache-aware routing encodes" in out and "3 replicas behind one router" in out
    assert "cache-aware+kv routing encodes" in out and "spared at placement" in out
    assert main([*FAST, "--replicas", "2", "--routing", "round-robin,cache-aware", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["routing"] for r in data["results"]] == ["round-robin", "cache-aware"]
    assert data["cache_aware_vs_lru_guess"] is None and data["cache_aware_vs_round_robin"] is not None
    assert data["cache_aware_kv_vs_round_robin"] is None
    assert all("placed_spared_embeds" in r for r in data["results"])
    assert all(len(r["per_replica"]) == 2 for r in data["results"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--routing", "round-robin"], "--routing routes across replicas: give --replicas N too"),
        (["--no-sticky-sessions"], "--no-sticky-sessions routes across replicas"),
        (["--replicas", "0"], "--replicas must be between 1 and 256, got 0"),
        (["--replicas", "2", "--routing", "random"], "--routing random: unknown; choose from round-robin"),
        (["--replicas", "2", "--policy", "vllm,gdsf"], "give one --policy"),
        (["--replicas", "2", "--policy", "oracle"], "--policy oracle needs the whole run in advance"),
        (["--replicas", "2", "--overload-slack", "-1"], "--overload-slack must be >= 0, got -1"),
        (["--replicas", "2", "--guess-entries", "0"], "--guess-entries must be >= 1, got 0"),
        (["--replicas", "2", "--cache-sizes", "4096,8192"], "--replicas runs one size per replica: give one"),
        (["--replicas", "2", "--behaviour", "fixed"], "--behaviour belongs to the policy comparison"),
        (["--replicas", "2", "--engine", "vllm"], "--replicas runs the built-in model only: drop --engine vllm"),
    ],
)
def test_bad_routing_options_are_one_line_and_exit_2(capsys, argv, message):
    assert main([*FAST, *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("encoder_cache simulate: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
