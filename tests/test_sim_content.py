"""Prompts described by content: block identity against vLLM's rule on
materialized token ids, prefix sharing across sessions, the trace format's
segments, and streamed generation."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from encoder_cache.simulator import SchedulerLimits, TraceError, TraceWorkload, Variant, simulate
from encoder_cache.simulator import workloads as workloads_module
from encoder_cache.simulator.prefix_cache import BLOCK_SIZE, BlockHasher
from encoder_cache.simulator.prompts import Prompts, materialize
from encoder_cache.simulator.spec import Answer, ItemSegment, RequestSpec, Text, own_text
from encoder_cache.simulator.trace import parse_line, write_trace
from encoder_cache.simulator.workloads import Workload, WorkloadConfig, generate

STEP = 0.05


def _vllm_block_keys(tokens: list[int], items, num_blocks: int) -> list[int]:
    """Block keys as vLLM 0.33 chains them: the parent, the block's token ids,
    and ("mm", identifier, offset relative to the block) per item it overlaps."""
    keys, parent = [], None
    for b in range(num_blocks):
        lo, hi = b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE
        extra = tuple(("mm", i.identifier, i.offset - lo) for i in items if i.offset < hi and i.offset + i.length > lo)
        parent = hash((parent, tuple(tokens[lo:hi]), extra or None))
        keys.append(parent)
    return keys


def _random_requests(seed: int, count: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    for n in range(count):
        rid = f"r{n}"
        segments: list = [Text("system", rng.choice([16, 30, 32, 64]))]
        for _ in range(rng.randint(0, 3)):
            if rng.random() < 0.6:
                name = rng.choice(["a", "b", "c"])
                segments.append(ItemSegment(name, {"a": 14, "b": 30, "c": 47}[name], rng.choice(["image", "video"])))
            else:
                segments.append(Text(rng.choice(["faq", None]), rng.randint(1, 40)))
        if specs and rng.random() < 0.3:  # a continued conversation
            previous = specs[-1]
            segments = [*previous.segments, Answer(previous.request_id, previous.output_tokens), *segments[1:]]
        specs.append(RequestSpec.described(rid, 0, None, None, own_text(rid, segments), rng.randint(1, 40)))
    return specs


@pytest.mark.parametrize("seed", range(4))
def test_block_identity_matches_vllm_hashing_of_the_materialized_tokens(seed):
    specs = _random_requests(seed, 40)
    prompts = Prompts()
    ours, theirs = [], []
    for spec in specs:
        runs = prompts.runs(spec)
        request = materialize(spec, runs)
        tokens = request.prompt_token_ids + request.output_token_ids
        assert len(request.prompt_token_ids) == spec.prompt_tokens and len(tokens) == spec.total_tokens
        blocks = spec.total_tokens // BLOCK_SIZE
        ours += BlockHasher(runs, spec.items, BLOCK_SIZE).upto(blocks)
        theirs += _vllm_block_keys(tokens, spec.items, blocks)
    shared = 0
    for (a, x), (b, y) in itertools.combinations(zip(ours, theirs), 2):
        assert (a == b) == (x == y)
        shared += a == b
    assert shared > 20, "the requests share blocks: the check compares something"


def test_materialized_tokens_are_deterministic_and_wrap_items():
    spec = RequestSpec.described(
        "q", 0, None, None, own_text("q", [Text("system", 5), ItemSegment("img", 3), Text(None, 2)]), 4
    )
    a = materialize(spec, Prompts().runs(spec))
    b = materialize(spec, Prompts().runs(spec))
    assert a == b
    ids = a.prompt_token_ids
    assert len(ids) == 5 + 1 + 3 + 1 + 2 and a.items[0].offset == 6
    assert ids[6] == ids[7] == ids[8], "an item's placeholders are one token"
    other = RequestSpec.described("z", 0, None, None, own_text("z", [Text("system", 7), ItemSegment("pic", 4)]), 1)
    o = materialize(other, Prompts().runs(other)).prompt_token_ids
    assert o[:5] == ids[:5], "the same content key gives the same tokens in every request"
    assert o[7] == ids[5] and o[12] == ids[9], "wrapper tokens are the modality's, for every item"
    assert o[8] == ids[6]


class _Config:
    def describe(self) -> str:
        return "hand-made"


def _popular(rid: str, arrival: int, system: int, image: int, question: int) -> RequestSpec:
    segments = own_text(rid, [Text("system", system), ItemSegment("hot", image), Text(None, question)])
    return RequestSpec.described(rid, arrival, None, None, segments, 8)


@pytest.mark.parametrize(
    ("image", "served_by_prefix"),
    [
        (46, True),  # 16 system + start + 46 placeholders end at token 63: the block [48, 64) is full and shared
        (40, False),  # the image's last block also holds the end token and the question: never shared
    ],
)
def test_a_popular_image_after_the_template_is_shared_across_requests_at_a_block_boundary(image, served_by_prefix):
    first = _popular("a", 0, 16, image, 30)
    second = _popular("b", 100, 16, image, 30)
    result = simulate(Workload(_Config(), (first, second)), SchedulerLimits(max_num_batched_tokens=512))
    c = result.counters
    assert c.prefix_skipped_items == (1 if served_by_prefix else 0)
    assert c.encoded_items == 1 and c.cache_hits == (0 if served_by_prefix else 1)
    assert c.prefix_hit_tokens >= 16, "the system prompt is shared either way"


def test_requests_about_one_video_share_its_frames_up_to_the_question():
    config = WorkloadConfig(kind="video", requests=60, video_catalogue=2, frames=(8, 8), seed=4)
    workload = generate(config)
    roomy = SchedulerLimits(max_num_batched_tokens=4096, encoder_cache_size=256)
    c = simulate(workload, roomy).counters
    # Each of the two videos is encoded once in full; later requests find every frame but
    # the one whose block reaches into the question in the prefix cache.
    assert c.prefix_skipped_items >= 7 * (60 - 2) - 8
    without = simulate(
        workload, SchedulerLimits(max_num_batched_tokens=4096, encoder_cache_size=256, prefix_caching=False)
    )
    assert without.counters.encoded_embeds > 5 * c.encoded_embeds


def test_every_generated_request_opens_with_the_one_system_prompt():
    for kind in ("chat", "video", "popular"):
        for spec in generate(WorkloadConfig(kind=kind, requests=30, system_tokens=100, seed=2)).requests():
            assert spec.segments[0] == Text("system", 100)
            if kind == "video":
                assert isinstance(spec.segments[-1], Text), "the question comes after the frames"


# The trace format


def test_a_prompt_of_segments_lays_out_text_and_wrapped_items():
    line = json.dumps(
        {
            "t": 1,
            "output_tokens": 3,
            "id": "q",
            "prompt": [
                {"text": "sys", "tokens": 20},
                {"id": "img", "embeds": 10},
                {"id": "clip", "embeds": 4, "modality": "video"},
                {"tokens": 7},
            ],
        }
    )
    _, spec = parse_line(line, "f.jsonl", 1, STEP)
    assert spec.segments == (
        Text("sys", 20),
        ItemSegment("img", 10),
        ItemSegment("clip", 4, "video"),
        Text(("q", 3), 7),
    )
    assert [(i.identifier, i.offset, i.length, i.modality) for i in spec.items] == [
        ("img", 21, 10, "image"),
        ("clip", 33, 4, "video"),
    ]
    assert spec.prompt_tokens == 20 + 12 + 6 + 7


def test_a_session_line_extends_its_previous_turn(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [
        {
            "t": 0,
            "session": "u",
            "id": "t0",
            "output_tokens": 5,
            "prompt": [{"text": "sys", "tokens": 16}, {"id": "x", "embeds": 8, "modality": "image"}],
        },
        {"t": 1, "session": "u", "id": "t1", "output_tokens": 2, "prompt": [{"tokens": 3}], "think": 0.5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    first, second = TraceWorkload(str(path), STEP).requests()
    assert second.segments == (*first.segments, Answer("t0", 5), Text(("t1", 0), 3))
    assert second.items == first.items and second.prompt_tokens == first.total_tokens + 3
    with open(tmp_path / "again.jsonl", "w") as handle:
        write_trace([first, second], handle, STEP)
    assert [json.loads(x)["prompt"] for x in (tmp_path / "again.jsonl").read_text().splitlines()] == [
        r["prompt"] for r in lines
    ]


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ({"text": "s"}, "field 'prompt[0].tokens': missing"),
        ({"tokens": 0}, "field 'prompt[0].tokens': must be >= 1"),
        ({"text": "", "tokens": 2}, "field 'prompt[0].text'"),
        ({"id": "a", "embeds": 3, "tokens": 2}, "field 'prompt[0].tokens': an item has"),
        ({"id": "a"}, "field 'prompt[0].embeds': missing"),
        ({"tokens": 2, "modality": "video"}, "field 'prompt[0].modality'"),
        ({"tokens": 2, "colour": 1}, "field 'prompt[0].colour': unknown"),
    ],
)
def test_bad_segments_name_the_field(prompt, field):
    line = json.dumps({"t": 0, "output_tokens": 1, "prompt": [prompt]})
    with pytest.raises(TraceError, match="^my.jsonl:4: ") as err:
        parse_line(line, "my.jsonl", 4, STEP)
    assert field in str(err.value)


def test_a_prompt_and_prompt_tokens_together_are_refused():
    line = '{"t": 0, "output_tokens": 1, "prompt": [], "prompt_tokens": 3}'
    with pytest.raises(TraceError, match="field 'prompt_tokens': give a prompt of segments"):
        parse_line(line, "f", 1, STEP)


def test_a_session_in_two_formats_is_refused(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"t": 0, "session": "u", "output_tokens": 1, "prompt": [{"tokens": 4}]}\n'
        '{"t": 1, "session": "u", "output_tokens": 1, "prompt_tokens": 9, "items": []}\n'
    )
    with pytest.raises(TraceError, match=r"mixed.jsonl:2: .*session 'u' mixes the two formats"):
        TraceWorkload(str(path), STEP)


@pytest.mark.parametrize("described", [False, True])
def test_one_id_with_two_sizes_is_a_validation_error_naming_line_id_and_sizes(tmp_path, described):
    def line(n: int, embeds: int) -> str:
        if described:
            return json.dumps({"t": n, "output_tokens": 1, "prompt": [{"id": "sha:1", "embeds": embeds}]})
        return json.dumps(
            {"t": n, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "sha:1", "embeds": embeds}]}
        )

    path = tmp_path / "sizes.jsonl"
    path.write_text("\n".join([line(0, 576), line(1, 64), line(2, 576), line(3, 1024)]) + "\n")
    with pytest.raises(TraceError) as err:
        TraceWorkload(str(path), STEP)
    message = str(err.value)
    assert message.startswith(f"{path}:2: ") and "'sha:1'" in message
    assert "64" in message and "576" in message and "line 1" in message


def test_a_large_workload_is_generated_as_a_stream(monkeypatch):
    config = WorkloadConfig(kind="mix", requests=300, seed=5)
    kept = generate(config)
    monkeypatch.setattr(workloads_module, "KEEP_IN_MEMORY", 100)
    streamed = generate(config)
    assert streamed.specs is None and streamed.num_requests == 300
    assert list(streamed.requests()) == list(kept.requests())
    assert streamed.max_embeds_per_item() == {"image": 2560, "video": 256}, "the config's bounds"
    limits = SchedulerLimits(encoder_cache_size=8192)
    assert simulate(streamed, limits, Variant()).counters == simulate(kept, limits, Variant()).counters


def test_reusing_a_previous_turns_block_hashes_changes_nothing(monkeypatch):
    from encoder_cache.simulator import engine

    workload = generate(WorkloadConfig(kind="chat", requests=120, think_steps=5.0, seed=3))
    limits = SchedulerLimits(kv_capacity=65536)
    reused = simulate(workload, limits, Variant()).counters
    monkeypatch.setattr(engine, "RECENT_SESSIONS", 0)
    recomputed = simulate(workload, limits, Variant()).counters
    assert reused == recomputed and reused.prefix_skipped_items > 0


def _positional_requests(seed: int, count: int) -> list[RequestSpec]:
    """Positional-format requests; some continue the previous one's session with more items."""
    from encoder_cache.simulator.spec import Item

    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    for n in range(count):
        if specs and rng.random() < 0.5:
            previous = specs[-1]
            offset = previous.total_tokens + rng.randint(1, 20)
            items = (*previous.items, Item(rng.choice("abc"), offset, 33, "image"))
            session = previous.session
        else:
            offset = rng.randint(1, 40)
            items = (Item(rng.choice("abc"), offset, rng.choice([14, 33, 47]), "image"),)
            session = f"s{n}"
        length = items[-1].offset + items[-1].length + 1 + rng.randint(0, 30)
        specs.append(RequestSpec(f"r{n}", 0, session, None, length, rng.randint(1, 40), items))
    return specs


@pytest.mark.parametrize("seed", range(3))
def test_positional_block_identity_matches_vllm_hashing_too(seed):
    prompts = Prompts()
    ours, theirs = [], []
    for spec in _positional_requests(seed, 40):
        runs = prompts.runs(spec)
        request = materialize(spec, runs)
        blocks = spec.total_tokens // BLOCK_SIZE
        ours += BlockHasher(runs, spec.items, BLOCK_SIZE).upto(blocks)
        theirs += _vllm_block_keys(request.prompt_token_ids + request.output_token_ids, spec.items, blocks)
    shared = 0
    for (a, x), (b, y) in itertools.combinations(zip(ours, theirs), 2):
        assert (a == b) == (x == y)
        shared += a == b
    assert shared > 20, "session turns share their history's blocks"


def test_block_hashes_computed_a_few_at_a_time_equal_all_at_once():
    prompts = Prompts()
    for spec in _random_requests(9, 30) + _positional_requests(9, 30):
        runs = prompts.runs(spec)
        blocks = spec.total_tokens // BLOCK_SIZE
        whole = BlockHasher(runs, spec.items, BLOCK_SIZE).upto(blocks)
        stepwise = BlockHasher(runs, spec.items, BLOCK_SIZE)
        n = 0
        while n < blocks:
            n = min(blocks, n + 1 + n % 3)
            stepwise.upto(n)
        assert stepwise.hashes == whole and len(whole) == blocks
