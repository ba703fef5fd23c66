"""vLLM 0.33.0's own code, the baselines of the benches.

The benches compare the Rust manager with what a vLLM user runs today:
``vllm/v1/core/encoder_cache_manager.py`` from the vLLM 0.33.0 wheel, loaded
without vLLM or torch (its four vLLM imports are stubbed: a logger and three
names used only in annotations). The host-tier benches compare
``HostBlockCache`` with the wheel's
``vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py``
(see ``host_tier_baseline``). Each file (see :data:`FILES`) is found, in this
order:

1. in the cache folder, ``$ENCODER_CACHE_VLLM_DIR`` or by default
   ``~/.cache/encoder-cache/vllm-0.33.0/``;
2. in an installed vLLM 0.33.0 of this environment (read as a file, not
   imported), copied into the cache folder;
3. only when ``ENCODER_CACHE_FETCH_VLLM=1`` (``make bench`` sets it): from the
   0.33.0 wheel, fetched with ``pip download --no-deps`` into a temporary
   folder; every baseline file not yet cached is extracted into the cache
   folder and the wheel (over 300 MB) is deleted.

Every copy is checked against the file's SHA-256 in the 0.33.0 wheel. When
none can be had, :func:`locate` raises :class:`Unavailable` with the reason and
the benches that need it skip with that reason, so ``make test`` never
downloads anything.

:class:`SchedulerLoops` renders vLLM 0.33's per-item scheduler loops
(``Scheduler._try_schedule_encoder_inputs``, ``_allocate_encoder_inputs``,
``_free_encoder_inputs``) over any per-call manager, with the step-level
method names of our managers, so the step benches can compare our one-call
step with what vLLM's scheduler does per request.

    python benches/vllm_baseline.py    # fetch what is missing if allowed, then say where the files are
"""

from __future__ import annotations

import bisect
import builtins
import hashlib
import importlib.metadata
import logging
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

VERSION = "0.33.0"
MEMBER = "vllm/v1/core/encoder_cache_manager.py"
HOST_TIER_MEMBER = "vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py"
#: The baseline files: wheel member -> (its name in the cache folder, its SHA-256 in the
#: vLLM 0.33.0 wheel, as the wheel's RECORD lists it).
FILES = {
    MEMBER: ("encoder_cache_manager.py", "68cca34767e91e3b33b0f8b67c3b534e5ee399fb8349adc1340a464549474fc6"),
    HOST_TIER_MEMBER: ("embedding_cache.py", "a90e991ac30163bd00f6501b1c66389e92fa6a9c556a17070982e8336f350593"),
}
FETCH_ENV = "ENCODER_CACHE_FETCH_VLLM"
DIR_ENV = "ENCODER_CACHE_VLLM_DIR"
#: What the module imports from vLLM, and what stands in for it.
_STUBS: dict[str, dict[str, Any]] = {
    "vllm.config": {"VllmConfig": type("VllmConfig", (), {})},
    "vllm.config.ec_manager_config": {"EncoderCacheManagerMetadata": type("EncoderCacheManagerMetadata", (), {})},
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.v1.request": {"Request": type("Request", (), {})},
}


class Unavailable(RuntimeError):
    """vLLM 0.33.0's module cannot be had here; the message says why and how to get it."""


def cache_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "encoder-cache" / f"vllm-{VERSION}"


def cached_path(member: str = MEMBER) -> Path:
    return cache_dir() / FILES[member][0]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _store(member: str, data: bytes, origin: str) -> Path:
    """Write ``member`` into the cache folder, atomically, after checking it."""
    if _digest(data) != FILES[member][1]:
        raise Unavailable(f"{origin} is not vLLM {VERSION}'s {member} (SHA-256 differs)")
    target = cached_path(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".tmp") as out:
        out.write(data)
    os.chmod(out.name, 0o644)
    os.replace(out.name, target)
    return target


def _from_installed(member: str) -> bytes | None:
    """``member`` of an installed vLLM 0.33.0, read as a file (vLLM is not imported)."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != VERSION:
        return None
    path = Path(dist.locate_file(member))
    return path.read_bytes() if path.is_file() else None


def _cached(member: str) -> Path | None:
    """The checked copy of ``member`` in the cache folder, else from an installed vLLM; None if neither."""
    path = cached_path(member)
    if path.is_file():
        if _digest(path.read_bytes()) == FILES[member][1]:
            return path
        path.unlink()  # a partial or foreign copy: get it again
    installed = _from_installed(member)
    if installed is not None:
        return _store(member, installed, f"the installed vLLM {VERSION}'s copy")
    return None


def fetch(members: list[str]) -> None:
    """Download the 0.33.0 wheel into a temporary folder and keep only ``members``."""
    with tempfile.TemporaryDirectory(prefix="encoder-cache-vllm-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--dest", tmp, "--quiet", f"vllm=={VERSION}"]
        print(
            f"fetching vLLM {VERSION}'s wheel for {', '.join(members)} (over 300 MB, deleted afterwards)",
            file=sys.stderr,
        )
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob(f"vllm-{VERSION}-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise Unavailable(f"pip download vllm=={VERSION} failed: {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in members:
                _store(member, wheel.read(member), f"{member} in {wheels[0].name}")


def locate(member: str = MEMBER, allow_fetch: bool | None = None) -> Path:
    """The cached copy of ``member``, copying or fetching it first if needed (see the module doc).

    A fetch keeps every baseline file not yet cached, so one download serves all the benches.
    """
    path = _cached(member)
    if path is not None:
        return path
    if allow_fetch is None:
        allow_fetch = os.environ.get(FETCH_ENV) == "1"
    if not allow_fetch:
        raise Unavailable(
            f"vLLM {VERSION}'s {member} is not cached at {cached_path(member)} and vLLM {VERSION} is not "
            f"installed; set {FETCH_ENV}=1 (make bench does) to fetch it once with pip download"
        )
    fetch([m for m in FILES if m == member or _cached(m) is None])
    return cached_path(member)


def _stub_import(name: str, globals=None, locals=None, fromlist=(), level=0):
    if name == "vllm" or name.startswith("vllm."):
        names = _STUBS.get(name)
        missing = [n for n in fromlist or () if names is None or n not in names]
        if missing or not fromlist:
            raise Unavailable(f"{MEMBER} imports {name} {list(fromlist or ())}, which the stubs do not cover")
        return types.SimpleNamespace(**names)
    return builtins.__import__(name, globals, locals, fromlist, level)


@cache
def load(allow_fetch: bool | None = None) -> types.ModuleType:
    """vLLM 0.33.0's ``encoder_cache_manager`` module, loaded with its vLLM imports stubbed."""
    path = locate(MEMBER, allow_fetch)
    module = types.ModuleType("vllm_0_33_encoder_cache_manager")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _stub_import}
    exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
    return module


def manager_class() -> type:
    """vLLM 0.33.0's ``EncoderCacheManager``."""
    return load().EncoderCacheManager


def _features_in_window(features: Any, start: int, end: int) -> tuple[int, int]:
    """vLLM's ``get_mm_features_in_window``: the features overlapping [start, end)."""
    lo = bisect.bisect_left(features, start + 1, key=lambda f: f.mm_position.offset + f.mm_position.length)
    hi = bisect.bisect_left(features, end, key=lambda f: f.mm_position.offset)
    return lo, hi


class SchedulerLoops:
    """vLLM 0.33 scheduler's per-item encoder-input loops over ``manager``
    (no EC connector, a decoder-only model, chunked multimodal input allowed),
    under our managers' step-level method names. A mismatch returns vLLM's
    rejection result."""

    is_encoder_decoder = False

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    def try_schedule_encoder_inputs(
        self,
        request: Any,
        num_computed_tokens: int,
        num_new_tokens: int,
        encoder_compute_budget: int,
        shift_computed_tokens: int = 0,
    ) -> tuple[list[int], int, int, list[int], list[int]]:
        if num_new_tokens == 0 or not request.has_encoder_inputs:
            return [], num_new_tokens, encoder_compute_budget, [], []
        manager = self.manager
        features = request.mm_features
        to_encode: list[int] = []
        from_remote: list[int] = []
        repeated: list[int] = []
        scheduled: dict[str, int] = {}
        num_embeds_to_schedule = 0
        window_end = num_computed_tokens + num_new_tokens + shift_computed_tokens
        lo, hi = _features_in_window(features, num_computed_tokens, window_end)
        for i in range(lo, hi):
            feature = features[i]
            start = feature.mm_position.offset
            length = feature.mm_position.length
            num_embeds = feature.mm_position.get_num_embeds()
            identifier = feature.identifier
            if identifier in scheduled:
                if scheduled[identifier] != num_embeds:
                    return [], 0, encoder_compute_budget, [], []
                repeated.append(i)
                continue
            cached = manager.get_cached_num_encoder_embeds(request, i)
            if cached is not None and cached != num_embeds:
                return [], 0, encoder_compute_budget, [], []
            if manager.check_and_update_cache(request, i):
                continue
            if not manager.can_allocate(request, i, encoder_compute_budget, num_embeds_to_schedule):
                if num_computed_tokens < start:
                    num_new_tokens = min(num_new_tokens, start - num_computed_tokens)
                else:
                    num_new_tokens = 0
                break
            first, last = feature.mm_position.get_embeds_indices_in_range(
                max(0, num_computed_tokens - start), min(length, window_end - start)
            )
            if last - first == 0:
                continue
            num_embeds_to_schedule += num_embeds
            encoder_compute_budget -= num_embeds
            scheduled[identifier] = num_embeds
            to_encode.append(i)
        return to_encode, num_new_tokens, encoder_compute_budget, from_remote, repeated

    def allocate_encoder_inputs(self, request: Any, input_ids: list[int], duplicate_input_ids: list[int]) -> None:
        for input_id in input_ids:
            self.manager.allocate(request, input_id)
        for input_id in duplicate_input_ids:
            self.manager.check_and_update_cache(request, input_id)

    def free_encoder_inputs_before(self, request: Any, position: int) -> list[int]:
        """vLLM's ``_free_encoder_inputs`` with ``position`` for
        ``num_computed_tokens - num_output_placeholders``; returns the freed ids
        (vLLM returns nothing: the list costs what its connector loop would)."""
        cached = self.manager.get_cached_input_ids(request)
        if not cached:
            return []
        freed = []
        for input_id in list(cached):
            position_range = request.mm_features[input_id].mm_position
            if position_range.offset + position_range.length <= position:
                self.manager.free_encoder_input(request, input_id)
                freed.append(input_id)
        return freed


def step_class() -> type:
    """vLLM's module under its scheduler's per-item loops: a manager class with
    the step-level methods, to bench against ours."""
    base = manager_class()

    class VllmStepManager(SchedulerLoops):
        def __init__(self, cache_size: int) -> None:
            super().__init__(base(cache_size))

    return VllmStepManager


if __name__ == "__main__":
    try:
        for member in FILES:
            print(locate(member))
    except Unavailable as exc:
        sys.exit(f"vllm_baseline: {exc}")
