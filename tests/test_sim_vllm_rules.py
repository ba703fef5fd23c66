"""vLLM 0.33's scheduling rules in the scheduler model, on workloads small
enough to follow by hand: whole-prompt admission, the null block, what a
failed admission gives back, when lookahead marks are set, and async
scheduling. (tests/test_vllm_calibration.py compares the model with vLLM's
own scheduler on larger workloads.)"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from encoder_cache import reference
from encoder_cache.simulator import SchedulerLimits, Variant, simulate, variants
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE
from encoder_cache.simulator.workloads import Item, RequestSpec, Workload


class _Config:
    def max_embeds_per_item(self):
        return {"image": 8}

    def describe(self):
        return "two requests"


def _request(name: str, arrival: int, prompt: int, output: int, image: str) -> RequestSpec:
    return RequestSpec(name, arrival, None, None, prompt, output, (Item(image, 1, 8, "image"),))


# A runs alone for a step; B arrives while A's prompt and answer fill most of a
# 10-block pool (A: 100 + 40 tokens, 9 blocks; B: 100 + 5 tokens, 7 blocks).
PAIR = Workload(_Config(), (_request("A", 0, 100, 40, "a"), _request("B", 1, 100, 5, "b")))
TIGHT = SchedulerLimits(max_num_batched_tokens=64, kv_capacity=11 * BLOCK_SIZE)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_is_admitted_only_when_its_whole_prompt_fits(async_scheduling):
    limits = replace(TIGHT, async_scheduling=async_scheduling)
    whole = simulate(PAIR, limits, check=True).counters
    assert whole.requests == 2
    assert whole.preemptions == 0, "B waits for A's blocks instead of starting and being preempted"
    chunk = simulate(PAIR, replace(limits, reserve_full_isl=False), check=True).counters
    assert chunk.requests == 2
    assert chunk.preemptions > 0, "admitted on its first chunk, B runs out of blocks and is preempted"


def test_one_block_is_kept_out_of_the_pool():
    limits = SchedulerLimits(kv_capacity=10 * BLOCK_SIZE)
    assert limits.kv_tokens == 9 * BLOCK_SIZE
    nine_blocks = Workload(_Config(), (_request("A", 0, 9 * BLOCK_SIZE - 1, 1, "a"),))
    assert simulate(nine_blocks, limits, check=True).counters.requests == 1
    ten_blocks = Workload(_Config(), (_request("A", 0, 9 * BLOCK_SIZE, 1, "a"),))
    with pytest.raises(ValueError, match="one kept out of the pool"):
        simulate(ten_blocks, limits)


class _Recording(reference.EncoderCacheManager):
    """The twin, recording the calls that matter here (a step ends with get_freed_mm_hashes)."""

    calls: list[tuple[str, str]]
    made: list[_Recording] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []
        _Recording.made.append(self)

    def mark_waiting(self, request, num_computed_tokens=0):
        self.calls.append(("mark", request.request_id))
        return super().mark_waiting(request, num_computed_tokens)

    def unmark_waiting(self, request):
        self.calls.append(("unmark", request.request_id))
        return super().unmark_waiting(request)

    def free(self, request):
        self.calls.append(("free", request.request_id))
        return super().free(request)

    def allocate_encoder_inputs(self, request, *args):
        self.calls.append(("allocate", request.request_id))
        return super().allocate_encoder_inputs(request, *args)

    def get_freed_mm_hashes(self):
        self.calls.append(("step", ""))
        return super().get_freed_mm_hashes()


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.setattr(variants.reference, "EncoderCacheManager", _Recording)
    monkeypatch.setattr(_Recording, "made", [])
    return _Recording.made


def test_lookahead_marks_the_waiting_queue_at_the_start_of_each_step(recording):
    both = Workload(_Config(), (_request("A", 0, 20, 2, "a"), _request("B", 0, 20, 2, "b")))
    simulate(both, replace(TIGHT, async_scheduling=False), Variant("vllm", True, "python"))
    calls = [c for c in recording[0].calls if c[0] in ("mark", "unmark", "step")]
    assert calls[:6] == [
        ("mark", "A"),
        ("mark", "B"),
        ("step", ""),  # both admitted in step 0: still marked during it
        ("unmark", "A"),
        ("unmark", "B"),
        ("step", ""),
    ], "as encoder_cache.vllm's scheduler subclasses set them"


def test_a_failed_admission_gives_back_what_its_lookup_took(recording):
    simulate(PAIR, replace(TIGHT, async_scheduling=False), Variant("vllm", False, "python"))
    calls = recording[0].calls
    first_allocation = calls.index(("allocate", "B"))
    assert ("free", "B") in calls[:first_allocation], "B's lookup is undone while it cannot be admitted"


def test_async_scheduling_schedules_as_many_steps_and_finishes_a_step_later():
    single = Workload(_Config(), (_request("A", 0, 100, 6, "a"),))
    sync = simulate(single, replace(TIGHT, async_scheduling=False), check=True).counters
    overlapped = simulate(single, replace(TIGHT, async_scheduling=True), check=True).counters
    # 100 prompt tokens in chunks of 64 and 36, then 5 more decode steps: the
    # async engine schedules no step past the last token.
    assert sync.steps == overlapped.steps == 2 + 5
    # A session's next turn (think time 0) arrives the step after its previous
    # turn is seen to finish: a step later with async scheduling, so the next
    # turn's own steps start one later, and the chat takes one more idle step.
    turn0 = RequestSpec("t0", 0, "s", None, 40, 4, (Item("a", 1, 8, "image"),))
    turn1 = RequestSpec("t1", 0, "s", 0, 60, 4, (Item("a", 1, 8, "image"),))
    chat = Workload(_Config(), (turn0, turn1))
    for mode in (False, True):
        c = simulate(chat, replace(TIGHT, async_scheduling=mode), check=True).counters
        assert c.requests == 2 and c.steps == 8
        assert c.prefix_hit_tokens == 2 * BLOCK_SIZE, "turn 1 finds turn 0's prompt and answer (44 tokens)"


# The command line


FAST = ["--requests", "30", "--no-progress", "--jobs", "1", "--no-sweep", "--policy", "vllm", "--no-lookahead"]


def test_the_scheduling_options_reach_the_run(capsys):
    from encoder_cache.__main__ import main

    assert main(["simulate", *FAST, "--json"]) == 0
    limits = json.loads(capsys.readouterr().out)["limits"]
    assert limits["async_scheduling"] is True and limits["reserve_full_isl"] is True, "vLLM's defaults"
    assert main(["simulate", *FAST, "--json", "--no-async-scheduling", "--no-scheduler-reserve-full-isl"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["limits"]["async_scheduling"] is False and data["limits"]["reserve_full_isl"] is False
    assert data["engine"] == "model"
    assert main(["simulate", *FAST]) == 0
    assert "the scheduler model, async scheduling, admission whole prompt" in capsys.readouterr().out


def test_engine_vllm_without_vllm_says_what_to_install(capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/test_vllm_calibration.py runs the engine")
    from encoder_cache.__main__ import main

    assert main(["simulate", *FAST, "--engine", "vllm"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--engine vllm" in err and "pip install 'vllm==0.33.*'" in err
