"""The host tier's Rust block cache (``encoder_cache.HostBlockCache``) against
its pure-Python twin (tests/host_tier_twin.py), under every policy: random
operation sequences, every return value, entry object and observable state
compared after every call. Then bad input (a clear exception, nothing
changed) and the stubs' docstrings. Needs no vLLM; test_host_tier_vllm.py
compares the cache with vLLM's own ``EmbeddingCache``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import random
import sys
import threading
from pathlib import Path

import pytest
from host_tier_twin import POLICIES, TwinBlockCache, random_operations

import encoder_cache
from encoder_cache import HOST_POLICIES, HostBlockCache, _core
from encoder_cache.invariants import InvariantError


def outcome(call):
    """A call's result as plain values (an entry as its fields), or the exception's type."""
    try:
        result = call()
    except (KeyError, ValueError) as exc:
        return ("raised", type(exc))
    return ("ok", entry_fields(result))


def entry_fields(entry):
    if entry is None or isinstance(entry, bool):
        return entry
    return (tuple(entry.block_ids), entry.shape, entry.ready, entry.evictable)


def observable(cache) -> dict:
    return {
        "free_blocks": list(cache.free_blocks),
        "evictable_blocks": cache.evictable_blocks,
        "eviction_order": cache.eviction_order(),
        "has_held_entries": cache.has_held_entries(),
        "stats": cache.stats(),
        "entries": {key: entry_fields(cache.get(key)) for key in sorted(keys(cache))},
    }


def keys(cache) -> list[str]:
    return cache.keys() if isinstance(cache, HostBlockCache) else list(cache.entries)


def test_the_policies_are_the_twins_and_fifo_is_the_default():
    assert HOST_POLICIES == POLICIES == ("fifo", "gdsf", "s3fifo")
    assert HostBlockCache(4).policy == "fifo"
    assert encoder_cache.HostBlockCache is _core.HostBlockCache


@pytest.mark.parametrize("policy", HOST_POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_rust_and_twin_agree_on_random_sequences(policy, seed):
    num_blocks = 14 + seed
    rust, twin = HostBlockCache(num_blocks, policy=policy), TwinBlockCache(num_blocks, policy)
    handed_out = []  # entry objects callers hold: they must follow the entry's state
    for step, (method, args) in enumerate(random_operations(seed, 800, num_keys=16, max_blocks=9)):
        got = outcome(lambda: getattr(rust, method)(*args))  # noqa: B023
        want = outcome(lambda: getattr(twin, method)(*args))  # noqa: B023
        assert got == want, (step, method, args)
        if method in ("alloc", "get", "pin_if_ready") and got[0] == "ok" and got[1] is not None:
            handed_out.append((rust.get(args[0]), twin.get(args[0])))
        assert observable(rust) == observable(twin), (step, method, args)
        for mine, theirs in handed_out[-20:]:
            assert (mine.ready, mine.evictable) == (theirs.ready, theirs.evictable)
    rust.check_invariants()
    assert rust.stats()["evictions"] > 5, "the sequence must make the policy choose"


def test_get_returns_the_same_live_object():
    cache = HostBlockCache(8)
    entry = cache.alloc("a", 3, (3, 64))
    assert cache.get("a") is entry and (entry.ready, entry.evictable) == (False, False)
    cache.mark_ready("a")
    assert (entry.ready, entry.evictable) == (True, True)
    assert cache.pin_if_ready("a") is entry and (entry.ready, entry.evictable) == (True, False)
    cache.unpin("a")
    assert entry.evictable and entry.block_ids == (5, 6, 7) and entry.shape == (3, 64)
    assert "a" in cache and len(cache) == 1 and "HostCacheEntry(3 blocks" in repr(entry)


def test_s3fifo_keeps_a_loaded_entry_that_fifo_evicts():
    """The point of the other policies: a loaded item survives a stream of one-offs."""
    kept = {}
    for policy in HOST_POLICIES:
        cache = HostBlockCache(10, policy=policy)
        cache.alloc("popular", 4, (4, 64))
        cache.mark_ready("popular")
        cache.pin("popular")
        cache.unpin("popular")
        for n in range(6):
            cache.alloc(f"once-{n}", 3, (3, 64))
            cache.mark_ready(f"once-{n}")
        kept[policy] = "popular" in cache
    assert kept == {"fifo": False, "gdsf": True, "s3fifo": True}


BAD_CALLS = [
    ("alloc", ("new", -1), ValueError),
    ("alloc", ("new", 99), ValueError),  # beyond the pool
    ("alloc", ("new", True), TypeError),
    ("alloc", ("new", 2.0), TypeError),
    ("alloc", ("new", 2**70), ValueError),
    ("alloc", ("new", 2, [2, 64]), ValueError),
    ("alloc", ("new", 2, (2,)), ValueError),
    ("alloc", ("new", 2, (2, -1)), ValueError),
    ("alloc", ("new", 2, ("2", 64)), ValueError),
    ("alloc", (7, 2), TypeError),
    ("alloc", ("ready", 1), ValueError),  # duplicate
    ("mark_ready", ("ready",), ValueError),
    ("mark_ready", ("missing",), KeyError),
    ("pin", ("writing",), ValueError),
    ("pin", (None,), TypeError),
    ("unpin", ("ready",), ValueError),
    ("unpin", ("missing",), KeyError),
    ("discard", ("ready",), ValueError),
    ("discard", ("pinned",), ValueError),
    ("discard", ("missing",), KeyError),
]


@pytest.mark.parametrize(("method", "args", "error"), BAD_CALLS, ids=[f"{m}{a}" for m, a, _ in BAD_CALLS])
def test_bad_input_raises_and_changes_nothing(method, args, error):
    cache = HostBlockCache(12, policy="gdsf")
    for key in ("ready", "pinned"):
        cache.alloc(key, 2, (2, 64))
        cache.mark_ready(key)
    cache.pin("pinned")
    cache.alloc("writing", 3)
    before = observable(cache)
    with pytest.raises(error) as info:
        getattr(cache, method)(*args)
    assert str(info.value)
    assert observable(cache) == before
    cache.check_invariants()


def test_bad_construction_raises():
    with pytest.raises(ValueError, match="policy must be one of fifo, gdsf, s3fifo"):
        HostBlockCache(4, policy="lru")
    with pytest.raises(ValueError, match="num_blocks must be >= 0"):
        HostBlockCache(-1)
    with pytest.raises(ValueError, match="< 2\\*\\*32"):
        HostBlockCache(2**32)
    with pytest.raises(TypeError):
        HostBlockCache("8")
    assert HostBlockCache(0).alloc("x", 0) is not None, "an empty entry fits an empty pool, as in vLLM"


def test_a_missing_key_is_a_key_error_naming_it():
    with pytest.raises(KeyError) as info:
        HostBlockCache(4).pin("mm-7")
    assert info.value.args == ("mm-7",)


def test_invariant_error_is_the_package_one():
    assert issubclass(InvariantError, Exception)
    HostBlockCache(4).check_invariants()  # nothing to report on a fresh cache


STUB = Path(_core.__file__).with_name("_core.pyi")


@pytest.mark.parametrize("name", ["HostBlockCache", "HostCacheEntry"])
def test_docstrings_match_the_stub(name):
    tree = ast.parse(STUB.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    stub = {"": ast.get_docstring(node)}
    stub |= {i.name: ast.get_docstring(i) for i in node.body if isinstance(i, ast.FunctionDef) and i.name[0] != "_"}
    cls = getattr(_core, name)
    assert inspect.getdoc(cls) == stub[""]
    public = sorted(n for n in vars(cls) if not n.startswith("_"))
    assert public == sorted(m for m in stub if m)
    for member in public:
        assert inspect.getdoc(inspect.getattr_static(cls, member)) == stub[member], member


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_connector_module_says_what_to_install_without_vllm():
    with pytest.raises(
        ImportError, match=r"needs vLLM 0\.33\.x, which is not installed: pip install 'vllm==0\.33\.\*'"
    ):
        importlib.import_module("encoder_cache.host_tier")


def test_threads_hammering_one_cache_serialise():
    """Saves and loads from four threads over shared keys, with a tiny switch
    interval: each call runs whole under the GIL, so a race between two
    threads' calls is at worst refused (KeyError, ValueError: the caller's
    race, changing nothing), never a borrow error, and the state stays sound."""
    cache = HostBlockCache(40, policy="s3fifo")
    unexpected: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(t: int) -> None:
        rng = random.Random(t)
        barrier.wait()
        try:
            for _ in range(3000):
                key = f"mm-{rng.randrange(20)}"
                try:
                    if rng.random() < 0.5:
                        if cache.alloc(key, rng.randrange(1, 8)) is not None:
                            cache.mark_ready(key)  # only the thread that allocated it marks it
                    else:
                        cache.pin(key)  # refused unless ready: then this thread holds a pin
                        cache.unpin(key)
                except (KeyError, ValueError):
                    pass  # another thread got there first
        except BaseException as err:
            unexpected.append(err)

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
    assert unexpected == []
    cache.check_invariants()
    assert not cache.has_held_entries(), "every pin taken was released, every alloc marked ready"
    assert cache.stats()["evictions"] > 0 and cache.stats()["pins"] > 0
