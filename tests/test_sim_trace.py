"""Traces: parsing good and bad lines, streaming, and export -> replay giving
the very counters of the built-in workload."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from encoder_cache.__main__ import main
from encoder_cache.simulator import (
    SchedulerLimits,
    TraceError,
    TraceWorkload,
    Variant,
    WorkloadConfig,
    available_policies,
    generate,
    simulate,
    write_trace,
)
from encoder_cache.simulator.trace import parse_line

STEP = 0.05
LIMITS = SchedulerLimits(max_num_batched_tokens=2048)


def test_items_without_offsets_come_first_then_the_text():
    line = '{"t": 1.0, "session": null, "prompt_tokens": 30, "output_tokens": 5, "items": [{"id": "a", "embeds": 100}, {"id": "b", "embeds": 7, "modality": "video"}]}'
    t, spec = parse_line(line, "f.jsonl", 3, STEP)
    assert t == 1.0 and spec.arrival == 20 and spec.request_id == "line3"
    assert [(i.identifier, i.offset, i.length, i.modality) for i in spec.items] == [
        ("a", 1, 100, "image"),
        ("b", 103, 7, "video"),
    ]
    assert spec.prompt_tokens == 30 + 100 + 2 + 7 + 2
    assert spec.output_tokens == 5 and spec.session is None and spec.think is None


def test_offsets_sessions_and_think():
    line = '{"t": 2, "session": 42, "prompt_tokens": 50, "output_tokens": 1, "think": 0.5, "id": "r", "items": [{"id": "a", "embeds": 10, "offset": 20}]}'
    _, spec = parse_line(line, "f.jsonl", 1, STEP)
    assert spec.session == "42" and spec.think == 10 and spec.request_id == "r"
    assert spec.items[0].offset == 20 and spec.prompt_tokens == 62


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("not json", "not a JSON object"),
        ("[1, 2]", "not a JSON object"),
        ('{"session": null, "prompt_tokens": 1, "output_tokens": 1, "items": []}', "field 't': missing"),
        ('{"t": -1, "prompt_tokens": 1, "output_tokens": 1, "items": []}', "field 't': must be a finite number >= 0"),
        ('{"t": "soon", "prompt_tokens": 1, "output_tokens": 1, "items": []}', "field 't': expected a number"),
        ('{"t": NaN, "prompt_tokens": 1, "output_tokens": 1, "items": []}', "field 't': must be a finite"),
        (
            '{"t": 0, "prompt_tokens": 1.5, "output_tokens": 1, "items": []}',
            "field 'prompt_tokens': expected an integer",
        ),
        ('{"t": 0, "prompt_tokens": 1, "output_tokens": 0, "items": []}', "field 'output_tokens': must be >= 1"),
        ('{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": {}}', "field 'items': expected a list"),
        (
            '{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "a"}]}',
            "field 'items[0].embeds': missing",
        ),
        (
            '{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "a", "embeds": 0}]}',
            "field 'items[0].embeds': must be >= 1",
        ),
        ('{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "", "embeds": 3}]}', "field 'items[0].id'"),
        (
            '{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "a", "embeds": 3, "size": 1}]}',
            "field 'items[0].size': unknown",
        ),
        ('{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [], "extra": 1}', "field 'extra': unknown"),
        ('{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "think": 2, "items": []}', "field 'think': needs a session"),
        ('{"t": 0, "session": true, "prompt_tokens": 1, "output_tokens": 1, "items": []}', "field 'session'"),
        (
            '{"t": 0, "prompt_tokens": 1, "output_tokens": 1, "items": [{"id": "a", "embeds": 3, "offset": 1}, {"id": "b", "embeds": 3}]}',
            "field 'items[1].offset': missing",
        ),
        (
            '{"t": 0, "prompt_tokens": 9, "output_tokens": 1, "items": [{"id": "a", "embeds": 3, "offset": 1}, {"id": "b", "embeds": 3, "offset": 4}]}',
            "field 'items[1].offset': 4 overlaps",
        ),
        (
            '{"t": 0, "prompt_tokens": 0, "output_tokens": 1, "items": [{"id": "a", "embeds": 3, "offset": 5}]}',
            "field 'prompt_tokens'",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(line, field):
    with pytest.raises(TraceError) as err:
        parse_line(line, "my.jsonl", 7, STEP)
    assert str(err.value).startswith("my.jsonl:7:")
    assert field in str(err.value)


def test_the_file_is_checked_whole_before_any_run(tmp_path):
    path = tmp_path / "t.jsonl"
    good = '{"t": %s, "prompt_tokens": 5, "output_tokens": 2, "items": [{"id": "a", "embeds": 4}]}'
    path.write_text("\n".join([good % 0, "", good % 1, good % 0.5]) + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl:4: field 't': 0.5 is earlier than the line before"):
        TraceWorkload(str(path), STEP)
    path.write_text("")
    with pytest.raises(TraceError, match="no requests"):
        TraceWorkload(str(path), STEP)


def test_a_trace_streams(tmp_path):
    path = tmp_path / "t.jsonl"
    line = '{"t": 0, "prompt_tokens": 5, "output_tokens": 2, "items": [{"id": "a", "embeds": 4}]}\n'
    path.write_text(line * 1000)
    trace = TraceWorkload(str(path), STEP)
    assert trace.num_requests == 1000 and trace.max_embeds_per_item() == {"image": 4}
    requests = trace.requests()
    assert isinstance(requests, types.GeneratorType), "read line by line, never as a list"
    assert next(requests).request_id == "line1"


@pytest.mark.parametrize("kind", ["chat", "popular", "mix"])
def test_export_then_replay_gives_identical_counters(tmp_path, kind):
    config = WorkloadConfig(kind=kind, requests=40, frames=(10, 20), think_steps=10.0, seed=11)
    workload = generate(config)
    path = tmp_path / "w.jsonl"
    with open(path, "w") as handle:
        assert write_trace(workload.requests(), handle, STEP) == 40
    trace = TraceWorkload(str(path), STEP)
    assert list(trace.requests()) == list(workload.requests())
    variants = [Variant()] + [Variant(p, True, "python") for p in available_policies("python")[1:]]
    for variant in variants:
        generated = simulate(workload, LIMITS, variant)
        replayed = simulate(trace, LIMITS, variant)
        assert generated.counters == replayed.counters, variant
        assert generated.encoder_cache_size == replayed.encoder_cache_size


def test_export_and_replay_through_the_command(tmp_path, capsys):
    path = tmp_path / "chat.jsonl"
    common = ["simulate", "--no-progress", "--jobs", "1", "--no-sweep", "--policy", "vllm", "--no-lookahead", "--json"]
    assert main([*common, "--export-trace", str(path), "--workload", "chat", "--requests", "30"]) == 0
    assert capsys.readouterr().out == f"wrote 30 requests to {path} (0.05 s per step)\n"
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) >= {"t", "session", "prompt", "output_tokens"}
    assert first["prompt"][0] == {"text": "system", "tokens": 64}, "the deployment's system prompt, by content"
    assert main([*common, "--workload", "chat", "--requests", "30"]) == 0
    generated = json.loads(capsys.readouterr().out)
    assert main([*common, "--trace", str(path)]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert generated["headline"][0]["counters"] == replayed["headline"][0]["counters"]


def test_a_bad_trace_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 0, "prompt_tokens": 5, "output_tokens": 2, "items": []}\n{"t": 1, "prompt_tokens": -5}\n')
    run = subprocess.run(
        [sys.executable, "-m", "encoder_cache", "simulate", "--trace", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"encoder_cache simulate: error: --trace: {path}:2: field 'output_tokens': missing\n")
