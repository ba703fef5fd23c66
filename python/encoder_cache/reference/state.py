"""The twin's state dumps: ``snapshot()`` dicts parsed, and checked against
the bookkeeping rules of :mod:`encoder_cache.invariants`.

``check_state`` checks the same rules, in the same order, with the same words
as the Rust managers (src/cache/state.rs), and ``parse_state`` accepts exactly
the dicts the Rust managers' ``restore`` accepts (src/bindings/state.rs), so a
state is judged identically by both implementations. Pure Python: the twin
uses it without the compiled module.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NoReturn

from encoder_cache.invariants import (
    COUNTED_REFERENCED,
    FREEABLE_SLOTS,
    FREEABLE_UNREFERENCED,
    OCCURRENCES_MATCH,
    POLICY_ORDERED,
    REFERRERS_COUNTED,
    SLOTS_ACCOUNTED,
    TIERS_ORDERED,
    InvariantError,
)
from encoder_cache.reference.checks import count, finite_float, rust_debug, state_str
from encoder_cache.reference.policies import S3FIFO_MAX_CREDIT

__all__ = [
    "check_encoder_decoder_state",
    "check_state",
    "parse_encoder_decoder_state",
    "parse_state",
]

_ENCODER_DECODER_KEYS = ("cache_size", "num_free_slots", "held", "allocated", "to_free")
_CACHE_KEYS = ("cache_size", "num_free_slots", "num_freeable_slots", "entries", "freeable", "requests", "freed")
#: Keys a snapshot may leave out (older snapshots), with their defaults.
_OPTIONAL_CACHE_KEYS = {"policy": "vllm", "clock": 0.0, "waiting": {}}
_OPTIONAL_ENTRY_KEYS = {"frequency": 1, "rank": 0.0}


def check_state(state: dict[str, Any]) -> None:
    """Raise :class:`InvariantError` for the first broken rule of a parsed
    ``EncoderCacheManager`` state (see :func:`parse_state`)."""
    entries, requests = state["entries"], state["requests"]
    free, freeable_slots = state["num_free_slots"], state["num_freeable_slots"]

    cached = sum(e["num_embeds"] for e in entries.values())
    if free + cached != state["cache_size"]:
        _broken(SLOTS_ACCOUNTED, f"{free} free + {cached} cached != {state['cache_size']}")

    seen: set[str] = set()
    for item, size in state["freeable"]:
        if item in seen:
            _broken(FREEABLE_UNREFERENCED, f"item '{item}' is listed twice")
        seen.add(item)
        entry = entries.get(item)
        if entry is None:
            _broken(FREEABLE_UNREFERENCED, f"freeable item '{item}' is not cached")
        if entry["referrers"]:
            _broken(
                FREEABLE_UNREFERENCED, f"freeable item '{item}' is referenced by {len(entry['referrers'])} requests"
            )
        if size != entry["num_embeds"]:
            _broken(FREEABLE_UNREFERENCED, f"freeable item '{item}' has size {size}, cached size {entry['num_embeds']}")
    for item in sorted(entries):
        if not entries[item]["referrers"] and item not in seen:
            _broken(FREEABLE_UNREFERENCED, f"unreferenced item '{item}' is not freeable")

    freeable = sum(size for _, size in state["freeable"])
    if freeable_slots != free + freeable:
        _broken(FREEABLE_SLOTS, f"{freeable_slots} freeable != {free} free + {freeable} freeable")

    for request in sorted(requests):
        held = requests[request]
        if not held["inputs"]:
            _broken(OCCURRENCES_MATCH, f"request '{request}' holds no inputs but is recorded")
        holding = Counter(dict.fromkeys(held["occurrences"], 0))
        holding.update(held["inputs"].values())
        for item in sorted(holding):
            claimed = held["occurrences"].get(item, 0)
            if claimed != holding[item] or not holding[item]:
                _broken(
                    OCCURRENCES_MATCH,
                    f"request '{request}' counts item '{item}' {claimed} times but holds it at {holding[item]} inputs",
                )

    for item in sorted(entries):
        for request in sorted(entries[item]["referrers"]):
            if item not in requests.get(request, {"occurrences": {}})["occurrences"]:
                _broken(
                    REFERRERS_COUNTED, f"item '{item}' is referenced by request '{request}', which does not count it"
                )

    for request in sorted(requests):
        for item in sorted(requests[request]["occurrences"]):
            entry = entries.get(item)
            if entry is None:
                _broken(COUNTED_REFERENCED, f"request '{request}' counts item '{item}', which is not cached")
            if request not in entry["referrers"]:
                _broken(COUNTED_REFERENCED, f"request '{request}' counts item '{item}' but is not among its referrers")

    needed = {item for items in state["waiting"].values() for item in items}
    tiers = [int(item in needed) for item, _ in state["freeable"]]
    for (item, _), tier, before in zip(state["freeable"], tiers, [0, *tiers]):
        if tier < before:
            _broken(TIERS_ORDERED, f"item '{item}', which no waiting request needs, follows one that a request needs")

    _check_policy_order(state, tiers)


def _check_policy_order(state: dict[str, Any], tiers: list[int]) -> None:
    """The built-in policies' structure; a custom policy's order is its own."""
    policy, entries, clock = state["policy"], state["entries"], state["clock"]
    for item in sorted(entries):
        entry = entries[item]
        if entry["frequency"] < 1:
            _broken(POLICY_ORDERED, f"item '{item}' has frequency 0")
        if entry["referrers"] and entry["rank"] != 0.0:
            _broken(POLICY_ORDERED, f"referenced item '{item}' has rank {entry['rank']}")
    if policy == "arc" and not (0 <= clock <= state["cache_size"] and clock == int(clock)):
        _broken(POLICY_ORDERED, f"arc's target {clock} is not a whole number from 0 to the cache size")
    previous: tuple[int, Any] | None = None
    for (item, _), tier in zip(state["freeable"], tiers):
        entry = entries[item]
        rank, frequency = entry["rank"], entry["frequency"]
        if policy == "vllm" and rank != 0.0:
            _broken(POLICY_ORDERED, f"item '{item}' has rank {rank} under vllm")
        if policy in ("gdsf", "lfu-ghost"):
            if tier == 0 and not rank >= clock:
                _broken(POLICY_ORDERED, f"item '{item}' has priority {rank} below the clock {clock} in tier 0")
            if previous is not None and previous[0] == tier and rank < previous[1]:
                _broken(POLICY_ORDERED, f"item '{item}' has priority {rank}, below the one before it")
            previous = (tier, rank)
        if policy == "s3fifo":
            main = frequency > 1
            if not (0 <= rank <= (S3FIFO_MAX_CREDIT if main else 0)) or rank != int(rank):
                _broken(POLICY_ORDERED, f"item '{item}' has hit credit {rank} with frequency {frequency}")
            if previous is not None and previous[0] == tier and previous[1] and not main:
                _broken(POLICY_ORDERED, f"item '{item}' of the small queue follows the main queue")
            previous = (tier, main)
        if policy == "duel" and not rank >= 0.0:
            _broken(POLICY_ORDERED, f"item '{item}' has priority {rank} under duel")
        if policy == "arc":
            frequent = frequency > 1
            if rank != 0.0:
                _broken(POLICY_ORDERED, f"item '{item}' has rank {rank} under arc")
            if previous is not None and previous[0] == tier and previous[1] and not frequent:
                _broken(POLICY_ORDERED, f"item '{item}' of the recent lane follows the frequent lane")
            previous = (tier, frequent)


def _broken(rule: str, detail: str) -> NoReturn:
    raise InvariantError(f"{rule}: {detail}")


def parse_state(state: Any) -> dict[str, Any]:
    """A ``snapshot()`` dict (possibly through JSON) checked for shape and types,
    with pairs turned into dicts and referrers into sets: TypeError or ValueError
    on a malformed one. The Rust managers accept exactly the same dicts."""
    state = _fields(state, _CACHE_KEYS, "state", _OPTIONAL_CACHE_KEYS)
    entries = {}
    for item, entry in _items(state["entries"], "state['entries']"):
        entry = _fields(entry, ("num_embeds", "referrers"), "an entry", _OPTIONAL_ENTRY_KEYS)
        frequency = count(entry["frequency"], "an entry's frequency")
        if frequency >= 2**32:
            raise ValueError("an entry's frequency must fit in 32 bits")
        entries[state_str(item, "an item")] = {
            "num_embeds": count(entry["num_embeds"], "an entry's num_embeds"),
            "referrers": {
                state_str(r, "an entry's referrers") for r in _list(entry["referrers"], "an entry's referrers")
            },
            "frequency": frequency,
            "rank": finite_float(entry["rank"], "an entry's rank"),
        }
    freeable = []
    for pair in _list(state["freeable"], "state['freeable']"):
        item, size = _two(pair, "a freeable [item, num_embeds] pair")
        freeable.append((state_str(item, "a freeable item"), count(size, "a freeable size")))
    requests = {}
    for request, held in _items(state["requests"], "state['requests']"):
        held = _fields(held, ("inputs", "occurrences"), "a request")
        inputs = {}
        for pair in _list(held["inputs"], "a request's inputs"):
            input_id, item = _two(pair, "an [input_id, item] pair")
            inputs[count(input_id, "an input id")] = state_str(item, "a held item")
        occurrences = {
            state_str(item, "a counted item"): count(n, "an occurrence count")
            for item, n in _items(held["occurrences"], "a request's occurrences")
        }
        if any(n >= 2**32 for n in occurrences.values()):
            raise ValueError("an occurrence count must fit in 32 bits")
        requests[state_str(request, "a request id")] = {"inputs": inputs, "occurrences": occurrences}
    policy = state_str(state["policy"], "state['policy']")
    waiting = {}
    for request, items in _items(state["waiting"], "state['waiting']"):
        marked = [state_str(item, "a waiting request's items") for item in _list(items, "a waiting request's items")]
        if len(set(marked)) != len(marked):
            raise ValueError("a waiting request's items must be distinct")
        waiting[state_str(request, "a waiting request id")] = marked
    return {
        "cache_size": count(state["cache_size"], "state['cache_size']"),
        "num_free_slots": count(state["num_free_slots"], "state['num_free_slots']"),
        "num_freeable_slots": count(state["num_freeable_slots"], "state['num_freeable_slots']"),
        "entries": entries,
        "freeable": freeable,
        "requests": requests,
        "freed": [state_str(s, "state['freed']") for s in _list(state["freed"], "state['freed']")],
        "policy": policy,
        "clock": finite_float(state["clock"], "state['clock']"),
        "waiting": waiting,
    }


def parse_encoder_decoder_state(state: Any) -> dict[str, Any]:
    """An ``EncoderDecoderCacheManager.snapshot()`` dict checked for shape and
    types, with each request's held inputs as a dict: TypeError or ValueError
    on a malformed one."""
    state = _fields(state, _ENCODER_DECODER_KEYS, "state")
    held = {}
    for request, inputs in _items(state["held"], "state['held']"):
        sizes = {}
        for pair in _list(inputs, "a request's held inputs"):
            input_id, size = _two(pair, "an [input_id, num_embeds] pair")
            sizes[count(input_id, "an input id")] = count(size, "a held size")
        held[state_str(request, "a request id")] = sizes
    return {
        "cache_size": count(state["cache_size"], "state['cache_size']"),
        "num_free_slots": count(state["num_free_slots"], "state['num_free_slots']"),
        "held": held,
        "allocated": [state_str(s, "state['allocated']") for s in _list(state["allocated"], "state['allocated']")],
        "to_free": [state_str(s, "state['to_free']") for s in _list(state["to_free"], "state['to_free']")],
    }


def check_encoder_decoder_state(state: dict[str, Any]) -> None:
    """The encoder-decoder rule: free slots and held sizes add up to cache_size."""
    held = sum(n for sizes in state["held"].values() for n in sizes.values())
    if held + state["num_free_slots"] != state["cache_size"]:
        _broken(SLOTS_ACCOUNTED, f"{state['num_free_slots']} free + {held} held != cache_size {state['cache_size']}")


def _fields(obj: Any, keys: tuple[str, ...], what: str, optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """``obj`` with every key of ``keys``, and those of ``optional`` (default
    filled in), and no other."""
    if not isinstance(obj, dict):
        raise TypeError(f"{what} must be a dict")
    for key in keys:
        if key not in obj:
            raise ValueError(f"{what} has no '{key}' key")
    optional = optional or {}
    if len(obj) - sum(key in obj for key in optional) != len(keys):
        optionally = f", and optionally {rust_debug(list(optional))}" if optional else ""
        raise ValueError(f"{what} must have exactly the keys {rust_debug(list(keys))}{optionally}")
    return {**optional, **obj}


def _items(obj: Any, what: str) -> list[tuple[Any, Any]]:
    if not isinstance(obj, dict):
        raise TypeError(f"{what} must be a dict")
    return list(obj.items())


def _list(obj: Any, what: str) -> list[Any]:
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"{what} must be a list")
    return list(obj)


def _two(obj: Any, what: str) -> tuple[Any, Any]:
    pair = _list(obj, what)
    if len(pair) != 2:
        raise ValueError(f"{what} must have two elements")
    return pair[0], pair[1]
