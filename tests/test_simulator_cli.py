"""``python -m encoder_cache simulate``: options, output formats, errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from encoder_cache.__main__ import main
from encoder_cache.simulator import available_policies
from encoder_cache.simulator.progress import Progress

FAST = ["--requests", "30", "--no-progress", "--jobs", "1"]
POLICIES = available_policies("python")


def simulate(capsys, *argv):
    code = main(["simulate", *FAST, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_run_leads_with_the_policies_then_sweeps_and_recommends(capsys):
    code, out, err = simulate(capsys, "--workload", "popular")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("workload popular: 30 requests, seed 0")
    assert "prefix caching on" in lines[0] and "7,168 bytes per embedding" in lines[0]
    assert lines[2].startswith("At vLLM's default capacity: encoder cache 8,192 embeddings (56.0 MiB)")
    names = [line.split()[0] for line in lines if line.split()[1:2] and line.split()[1][:1].isdigit()]
    for policy in POLICIES:
        assert policy in names and f"{policy}+lookahead" in names
    assert "oracle" in names
    assert "Encoded embeddings by encoder-cache size" in out
    for size in ("8,192", "32,768", "131,072", "unbounded"):
        assert any(line.startswith(size) for line in lines), size
    assert lines[-1].startswith("Recommendation: ")


def test_json_has_every_run_and_separates_counters_from_timings(capsys):
    argv = ["--json", "--workload", "mix", "--frames", "10:20", "--seed", "7", "--cache-sizes", "4096,16384"]
    _, out, _ = simulate(capsys, *argv)
    first = json.loads(out)
    _, again, _ = simulate(capsys, *argv)
    second = json.loads(again)
    assert first["workload"]["kind"] == "mix" and first["workload"]["frames"] == [10, 20]
    names = [run["name"] for run in first["headline"]]
    assert names[0] == "vllm" and "oracle" in names
    assert {(r["name"], r["encoder_cache_size"]) for r in first["sweep"]} == {
        (n, s) for n in names for s in (4096, 16384)
    }
    assert first["unbounded"]["counters"]["recomputed_embeds"] == 0
    assert first["recommendation"]["size"] in (4096, 16384)
    for a, b in zip(first["headline"] + first["sweep"], second["headline"] + second["sweep"]):
        assert a["counters"] == b["counters"]
        assert set(a["timings"]) == {"bookkeeping_seconds", "bookkeeping_us_per_step", "wall_seconds"}
        assert a["encoder_cache_bytes"] == a["encoder_cache_size"] * 7168
    assert first["headline"][0]["counters"]["requests"] == 30


def test_options_reach_the_run(capsys):
    argv = [
        "--json",
        "--no-sweep",
        "--policy",
        "vllm",
        "--no-lookahead",
        "--impl",
        "python",
        "--max-num-batched-tokens",
        "4096",
        "--encoder-cache-size",
        "9000",
        "--max-num-encoder-input-tokens",
        "3000",
        "--image-embeds",
        "300",
        "--workload",
        "chat",
        "--bytes-per-embed",
        "1000",
        "--encoder-us-per-embed",
        "1",
        "--encoder-us-per-embed-sq",
        "0",
        "--no-prefix-caching",
    ]
    _, out, _ = simulate(capsys, *argv)
    data = json.loads(out)
    (run,) = data["headline"]
    assert run["encoder_cache_size"] == 9000 and run["encoder_cache_bytes"] == 9_000_000
    assert run["encoder_compute_budget"] == 3000
    assert run["variant"]["implementation"] == "python"
    assert data["limits"]["max_num_batched_tokens"] == 4096 and data["limits"]["prefix_caching"] is False
    assert data["workload"]["image_embeds"] == [300, 300], "N alone means N:N"
    counters = run["counters"]
    assert counters["prefix_query_tokens"] == counters["prefix_hit_tokens"] == 0
    assert counters["encoder_seconds"] == pytest.approx(counters["encoded_embeds"] * 1e-6)
    assert data["sweep"] == [] and data["recommendation"] is None


def test_lookahead_flag_keeps_only_marked_variants(capsys):
    _, out, _ = simulate(capsys, "--json", "--no-sweep", "--lookahead", "--policy", ",".join(POLICIES))
    assert [r["name"] for r in json.loads(out)["headline"]] == [f"{p}+lookahead" for p in POLICIES]


def test_behaviour_comparison_is_still_there(capsys):
    code, out, _ = simulate(capsys, "--behaviour", "fixed,prefix", "--workload", "chat", "--no-prefix-caching")
    assert code == 0
    assert "behaviour" in out and "evicted in use" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split()[1:2] and line.split()[1][:1].isdigit()]
    assert rows == ["fixed", "prefix"]
    assert "Recommendation" not in out


def test_plot_writes_a_png(capsys, tmp_path):
    path = tmp_path / "sweep.png"
    code, out, _ = simulate(capsys, "--plot", str(path), "--policy", "vllm", "--no-lookahead")
    assert code == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.splitlines()[-1] == f"plot written to {path}"


def test_plot_without_an_extension_gets_png_and_says_so(capsys, tmp_path):
    path = tmp_path / "noext"
    code, out, _ = simulate(capsys, "--plot", str(path), "--policy", "vllm", "--no-lookahead", "--no-sweep")
    assert code == 0
    assert not path.exists() and (tmp_path / "noext.png").exists()
    assert out.splitlines()[-1] == f"plot written to {path}.png"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "--requests must be > 0"),
        (["--requests", "many"], "argument --requests: expected an integer, got 'many'"),
        (["--workload", "audio"], "invalid choice"),
        (["--impl", "java"], "--impl java: unknown"),
        (["--policy", "lru"], "--policy lru: unknown"),
        (["--policy", ""], "expected a comma-separated list"),
        (["--behaviour", "fixed,odd"], "--behaviour odd: unknown"),
        (["--behaviour", "fixed", "--policy", "vllm"], "--behaviour compares the vllm policy"),
        (["--image-embeds", "900:100"], "--image-embeds must be a range"),
        (["--image-embeds", "a:b"], "expected MIN:MAX or N"),
        (["--mix", "1:2"], "expected CHAT:VIDEO:POPULAR"),
        (["--repeat-prob", "2"], "--repeat-prob must be in [0, 1]"),
        (["--zipf", "nan"], "argument --zipf: expected a finite number, got 'nan'"),
        (["--workload", "popular", "--zipf", "inf"], "argument --zipf: expected a finite number"),
        (["--arrival-rate=-inf"], "argument --arrival-rate: expected a finite number"),
        (["--kv-capacity", "500"], "--kv-capacity 500 holds"),
        (["--max-num-seqs", "-1"], "--max-num-seqs must be > 0"),
        (["--cache-sizes", "8:2"], "expected MIN:MAX[:FACTOR]"),
        (["--cache-sizes", "0,5"], "expected sizes > 0"),
        (["--cache-sizes", "1024", "--no-sweep"], "contradict"),
        (["--bytes-per-embed", "0"], "--bytes-per-embed must be > 0"),
        (["--bytes-per-embed", "2", "--hidden-size", "4"], "--bytes-per-embed replaces"),
        (["--encoder-us-per-embed", "-1"], "--encoder-us-per-embed must be a finite number >= 0"),
        (["--step-seconds", "0"], "--step-seconds must be > 0"),
        (["--trace", "/no/such/trace.jsonl"], "--requests shapes a built-in workload; --trace replays a file"),
        (["--plot", "/no/such/dir/plot.png"], "no directory /no/such/dir"),
        (["--no-such-option"], "unrecognized arguments"),
    ],
)
def test_bad_values_one_line_exit_2(capsys, argv, message):
    try:
        code = main(["simulate", *FAST, *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("encoder_cache simulate: error: ")
    assert message in err
    assert "Traceback" not in err


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_progress_bar_draws_and_clears():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = Progress(total=10, stream=stream, delay=0.0, interval=0.0)
    bar.label = "vllm"
    bar.update(5)
    assert stream.getvalue() == "\r[" + "#" * 15 + " " * 15 + "]  50% vllm"
    bar.close()
    assert stream.getvalue().endswith("\r\x1b[K")


def test_progress_bar_waits_for_long_runs():
    stream = io.StringIO()
    bar = Progress(total=10, stream=stream, delay=60.0)
    bar.update(5)
    bar.close()
    assert stream.getvalue() == ""


# Issue 16: each bad input through the real entry point, in a subprocess.

BAD_INPUTS = [
    (["--plot", "/sys/plot.png"], "--plot /sys/plot.png: cannot write in /sys"),
    (["--plot", "{tmp}/out.txt"], "unsupported format .txt"),
    (["--plot", "/"], "--plot /: is a directory"),
    (["--plot", "{tmp}"], "is a directory"),
    (["--workload", "popular", "--zipf", "nan"], "argument --zipf: expected a finite number, got 'nan'"),
    (["--workload", "popular", "--zipf", "inf"], "argument --zipf: expected a finite number, got 'inf'"),
    (["--workload", "chat", "--zipf", "nan"], "argument --zipf: expected a finite number, got 'nan'"),
    (["--repeat-prob", "nan"], "argument --repeat-prob: expected a finite number"),
    (["--think-steps", "inf"], "argument --think-steps: expected a finite number"),
    (["--mix", "1:nan:1"], "argument --mix: expected CHAT:VIDEO:POPULAR finite weights"),
    (["--encoder-us-per-embed-sq", "nan"], "argument --encoder-us-per-embed-sq: expected a finite number"),
    (["--step-seconds", "inf"], "argument --step-seconds: expected a finite number"),
    (["--requests", "0"], "--requests must be > 0, got 0"),
    (["--turns", "3:1"], "--turns must be a range MIN:MAX with 0 <= MIN <= MAX, got 3:1"),
    (["--export-trace", "/sys/w.jsonl"], "--export-trace /sys/w.jsonl: cannot write in /sys"),
    (["--trace", "/no/such/trace.jsonl"], "--trace /no/such/trace.jsonl: no such file"),
    (["--trace", "{tmp}"], "--trace {tmp}: no such file"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_cli_input_exit_2_one_line_nothing_written(tmp_path, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = set(os.listdir(tmp_path))
    run = subprocess.run(
        [sys.executable, "-m", "encoder_cache", "simulate", "--plot", str(tmp_path / "p.png"), *argv]
        if "--plot" not in argv and "--export-trace" not in argv
        else [sys.executable, "-m", "encoder_cache", "simulate", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("encoder_cache simulate: error: ")
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert "Traceback" not in run.stderr
    assert set(os.listdir(tmp_path)) == before, "no file written"
    assert not os.path.exists("/sys/plot.png") and not os.path.exists("/.png")


def test_end_to_end_command(tmp_path):
    """The README's command, as a subprocess, on a small scale."""
    plot = tmp_path / "sweep.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "encoder_cache",
            "simulate",
            "--requests",
            "40",
            "--frames",
            "10:30",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # not a terminal: no progress bar
    assert "At vLLM's default capacity" in run.stdout and "Recommendation:" in run.stdout
    assert run.stdout.splitlines()[-1] == f"plot written to {plot}"
    assert plot.stat().st_size > 0


def test_cache_sizes_lists_and_ranges():
    from encoder_cache.simulator.options import _sizes

    assert _sizes("8192,2048,8192") == [2048, 8192]
    assert _sizes("2048:131072:4") == [2048, 8192, 32768, 131072]
    assert _sizes("1000:4000") == [1000, 2000, 4000]
