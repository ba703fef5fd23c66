"""The step hook: a callable each manager runs at the end of
``get_freed_mm_hashes()``, when it is due, on the Rust managers and their
twins alike; and the observers that reporting managers set as their hook."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import make_request

import encoder_cache
from encoder_cache import reference
from encoder_cache.observed import StepObservers, observed_class

CLASSES = {
    "rust": encoder_cache.EncoderCacheManager,
    "rust-encoder-decoder": encoder_cache.EncoderDecoderCacheManager,
    "python": reference.EncoderCacheManager,
    "python-encoder-decoder": reference.EncoderDecoderCacheManager,
}


@pytest.fixture(params=sorted(CLASSES))
def hooked_cls(request):
    return CLASSES[request.param]


class Calls:
    """A hook that records the managers it ran with and returns ``wait``."""

    def __init__(self, wait: float | None) -> None:
        self.wait = wait
        self.managers: list[object] = []

    def __call__(self, manager: object) -> float | None:
        self.managers.append(manager)
        return self.wait


def steps(manager, n: int) -> None:
    for _ in range(n):
        manager.get_freed_mm_hashes()


@pytest.mark.parametrize("wait", [None, 0, 0.0])
def test_a_hook_that_need_not_wait_runs_at_every_step_with_the_manager(hooked_cls, wait):
    manager, hook = hooked_cls(8), Calls(wait)
    manager.set_step_hook(hook)
    steps(manager, 5)
    assert hook.managers == [manager] * 5


def test_a_hook_runs_at_the_first_step_then_waits_as_long_as_it_said(hooked_cls):
    manager, hook = hooked_cls(8), Calls(3600)
    manager.set_step_hook(hook)
    steps(manager, 20)
    assert len(hook.managers) == 1, "an hour's wait: only the first step ran it"
    hook.wait = 0.01
    manager.set_step_hook(hook)  # setting a hook again makes it due at once
    steps(manager, 3)
    assert len(hook.managers) == 2
    time.sleep(0.05)
    steps(manager, 1)
    assert len(hook.managers) == 3


@pytest.mark.parametrize("cls", [encoder_cache.EncoderCacheManager, reference.EncoderCacheManager])
def test_the_hook_runs_after_the_step_s_identifiers_are_taken(cls):
    manager = cls(8)
    seen: list[list[str]] = []
    manager.set_step_hook(lambda m: seen.append(m.get_freed_mm_hashes()) or 3600)
    one_step(manager)
    assert manager.get_freed_mm_hashes() == reference_freed(cls) != []
    assert seen == [[]], "the hook (an hour between runs) found the report taken, and its own call did not run it again"


@pytest.mark.parametrize("raised", [ValueError("broken metrics"), RuntimeError("x")])
def test_a_hook_that_raises_is_reported_and_the_step_goes_on(hooked_cls, raised, monkeypatch, capsys):
    manager = hooked_cls(8)
    reported: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: reported.append(args.exc_value))
    calls = []

    def hook(m):
        calls.append(m)
        raise raised

    manager.set_step_hook(hook)
    ended = one_step(manager)
    assert manager.get_freed_mm_hashes() == reference_freed(hooked_cls) != []
    manager.get_freed_mm_hashes()
    assert len(calls) == ended + 2, "a hook that raised runs again at the next step"
    if hooked_cls in (reference.EncoderCacheManager, reference.EncoderDecoderCacheManager):
        err = capsys.readouterr().err
        assert err.count("Exception ignored in") == ended + 2 and str(raised) in err
    else:
        assert reported == [raised] * (ended + 2)


def one_step(manager) -> int:
    """Item "a" cached and released, then "b" evicts it (the encoder-decoder
    managers report "a" at the step after its allocation instead, so a step
    ends here for them); returns the steps ended."""
    request = make_request("r", ["a"], [8])
    assert manager.can_allocate(request, 0, 8, 0)
    manager.allocate(request, 0)
    manager.free(request)
    if not isinstance(manager, (encoder_cache.EncoderDecoderCacheManager, reference.EncoderDecoderCacheManager)):
        assert manager.can_allocate(make_request("s", ["b"], [8]), 0, 8, 0)
        return 0
    manager.get_freed_mm_hashes()
    return 1


def reference_freed(cls) -> list[str]:
    """What the same step reports without a hook."""
    manager = cls(8)
    one_step(manager)
    return manager.get_freed_mm_hashes()


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), "soon"])
def test_a_wait_that_is_not_seconds_is_reported_and_the_hook_runs_next_step(hooked_cls, wait, monkeypatch, capsys):
    manager, hook = hooked_cls(8), Calls(wait)
    reported: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: reported.append(args.exc_value))
    manager.set_step_hook(hook)
    steps(manager, 2)
    assert len(hook.managers) == 2
    if hooked_cls in (reference.EncoderCacheManager, reference.EncoderDecoderCacheManager):
        assert capsys.readouterr().err.count("Exception ignored in") == 2
    else:
        assert len(reported) == 2 and all(isinstance(e, (TypeError, ValueError)) for e in reported)


def test_an_interrupt_in_the_hook_goes_through(hooked_cls):
    manager = hooked_cls(8)

    def hook(m):
        raise KeyboardInterrupt

    manager.set_step_hook(hook)
    with pytest.raises(KeyboardInterrupt):
        manager.get_freed_mm_hashes()


def test_none_removes_the_hook_and_a_bad_hook_changes_nothing(hooked_cls):
    manager, hook = hooked_cls(8), Calls(None)
    manager.set_step_hook(hook)
    with pytest.raises(TypeError, match="callable"):
        manager.set_step_hook(42)
    steps(manager, 2)
    assert len(hook.managers) == 2, "the refused hook left the old one in place"
    manager.set_step_hook(None)
    steps(manager, 2)
    assert len(hook.managers) == 2


def test_a_hook_that_sets_another_hook_leaves_the_new_one_due(hooked_cls):
    manager, second = hooked_cls(8), Calls(3600)

    def first(m):
        m.set_step_hook(second)
        return 3600

    manager.set_step_hook(first)
    steps(manager, 2)
    assert second.managers == [manager], "the new hook ran at the next step, not an hour later"


class CountingObservers(StepObservers):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ends = 0

    def end_step(self, manager):
        self.ends += 1
        return super().end_step(manager)


def test_observers_run_only_when_their_log_line_is_due():
    logged: list[dict] = []
    manager = observed_class(encoder_cache.EncoderCacheManager)(8)
    manager.observers = observers = CountingObservers(log=logged.append, log_interval=3600.0)
    steps(manager, 50)
    assert observers.ends == 1, "the first step schedules the first line; the next is an hour away"
    assert logged == []
    observers._next_log = time.monotonic() - 1  # as if the hour had passed
    manager.set_step_hook(observers.end_step)
    steps(manager, 1)
    assert len(logged) == 1 and logged[0] == manager.stats()


def test_observers_with_a_publisher_run_at_every_step():
    published: list[object] = []

    class Feed:
        def publish(self, batch):
            published.append(batch)

        def close(self):
            pass

    manager = observed_class(encoder_cache.EncoderCacheManager)(8)
    manager.observers = observers = CountingObservers(publisher=Feed(), log=print, log_interval=3600.0)
    for n in range(4):
        request = make_request(f"r{n}", [f"i{n}"], [4])
        assert manager.can_allocate(request, 0, 4, 0)
        manager.allocate(request, 0)
        manager.get_freed_mm_hashes()
        manager.free(request)
    assert observers.ends == 4
    assert len(published) == 4, "each step stored an item, and each was published at its end"


def test_observers_that_report_nothing_per_step_set_no_hook():
    manager = observed_class(encoder_cache.EncoderCacheManager)(8)
    manager.set_step_hook(Calls(None))
    manager.observers = StepObservers()
    steps(manager, 1)
    assert manager.observers.per_step is False
