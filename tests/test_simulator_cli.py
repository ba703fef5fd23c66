"""``python -m encoder_cache simulate``: options, output formats, errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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
    recommendation = next(i for i, line in enumerate(lines) if line.startswith("Recommendation: "))
    assert json.loads(lines[-1].removeprefix("manager_config: "))["cache_size"] > 0, "it ends with the config to paste"
    assert lines[recommendation:-1], "between them: which lever matters"


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
    assert first["recommendation"]["size"] in {r["encoder_cache_size"] for r in first["search"]} | {8192}
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


# Each bad input through the real entry point, in a subprocess.

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

    assert _sizes("8192,2048,8192").embeds(7168) == [2048, 8192]
    assert _sizes("2048:131072:4").embeds(7168) == [2048, 8192, 32768, 131072]
    assert _sizes("1000:4000").embeds(7168) == [1000, 2000, 4000]


def test_cache_sizes_in_memory_units_convert_with_hidden_size_and_dtype():
    from encoder_cache.simulator.options import _sizes

    assert _sizes("512MiB,2GiB").embeds(3584 * 2) == [(512 << 20) // 7168, (2 << 30) // 7168]
    assert _sizes("1GB").embeds(1000) == [1_000_000]
    assert _sizes("64MiB:256MiB").embeds(4096 * 4) == [4096, 8192, 16384]


def test_cache_sizes_in_memory_reach_the_run(capsys):
    argv = ["--json", "--policy", "vllm", "--no-lookahead", "--hidden-size", "1024", "--dtype", "float32"]
    _, out, _ = simulate(capsys, *argv, "--cache-sizes", "16MiB,64MiB")
    sizes = {r["encoder_cache_size"] for r in json.loads(out)["sweep"]}
    assert sizes == {4096, 16384}, "16 MiB / (1024 x 4 bytes) = 4,096 embeddings"
    code, _, err = simulate(capsys, "--cache-sizes", "1KiB", "--hidden-size", "1024")
    assert code == 2 and "--cache-sizes: every size must hold at least one embedding" in err


def test_the_recommendation_does_not_depend_on_the_sizes_swept(capsys):
    common = ["--json", "--workload", "popular", "--requests", "60", "--policy", "vllm,s3fifo"]
    results = []
    for sizes in (None, "4096,16384", "3000:300000:10", "1GiB"):
        _, out, _ = simulate(capsys, *common, *(["--cache-sizes", sizes] if sizes else []))
        data = json.loads(out)
        results.append((data["recommendation"], data["recommendation_text"]))
        assert data["recommendation_text"].splitlines()[-1] == (
            "manager_config: " + json.dumps(data["recommendation"]["manager_config"])
        )
    assert all(r == results[0] for r in results)


def test_best_policy_and_recommendation_say_when_lookahead_needs_the_scheduler(capsys):
    from encoder_cache.simulator import RunResult, SchedulerLimits, Variant
    from encoder_cache.simulator.cost import EncoderCost
    from encoder_cache.simulator.report import Report
    from encoder_cache.simulator.results import Counters

    def result(variant, size, encoded):
        return RunResult(variant, 8192, size, Counters(encoded_embeds=encoded, encoded_items=1), 0.0, 0.0)

    lookahead = Variant("s3fifo", True)
    report = Report("hand-made", SchedulerLimits(), EncoderCost(), 2, "test", 8192)
    report.headline = [result(Variant(), 8192, 1000), result(lookahead, 8192, 900)]
    report.unbounded = result(Variant(), 1 << 40, 880)
    report.search = [result(Variant(), 4096, 1500), result(lookahead, 4096, 1200)]
    text = report.text()
    assert "Best policy here: s3fifo+lookahead (lookahead: needs vLLM's --scheduler-cls" in text
    lines = text.splitlines()
    assert lines[-2].startswith("Lookahead needs vLLM started with --scheduler-cls encoder_cache.vllm.AsyncScheduler")
    assert lines[-1] == 'manager_config: {"cache_size": 8192, "policy": "s3fifo", "lookahead": true}'
    assert report.to_json({})["best_policy_needs_scheduler_cls"] is True


def test_vs_unbounded_names_the_policy_it_shows(capsys):
    _, out, _ = simulate(capsys, "--workload", "popular", "--policy", "vllm,s3fifo", "--no-lookahead")
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("cache size"))
    assert header.endswith("best policy vs unbounded")
    rows = [line for line in lines if line[:1].isdigit() and "miss" in line]
    assert rows and all(line.split()[-1] in ("vllm", "s3fifo") for line in rows)


def test_a_text_only_trace_gives_one_message(tmp_path, capsys):
    path = tmp_path / "text.jsonl"
    path.write_text(
        '{"t": 0, "prompt_tokens": 50, "output_tokens": 5, "items": []}\n'
        '{"t": 1, "output_tokens": 5, "prompt": [{"text": "system", "tokens": 40}]}\n'
    )
    code = main(["simulate", "--no-progress", "--trace", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "trace text.jsonl: 2 requests, 50 ms per step: no request has a multimodal item, "
        "so the encoder cache has nothing to do and there is nothing to compare."
    ]


def test_plot_formats_agree_between_help_error_and_docs(capsys):
    from encoder_cache.simulator.options import PLOT_FORMATS

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "format: " + ", ".join(PLOT_FORMATS) + " (default .png" in help_text
    code, _, err = simulate(capsys, "--plot", "out.gif")
    assert code == 2 and "use one of ." + ", .".join(PLOT_FORMATS) in err
    docs = (Path(__file__).parent.parent / "docs" / "simulator.md").read_text()
    assert "`--plot PATH` (" + ", ".join(PLOT_FORMATS) + ")" in docs


def test_the_plot_hint_points_at_the_checkout_not_pypi(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    code, _, err = simulate(capsys, "--plot", "out.png")
    assert code == 2 and "pip install matplotlib" in err and "encoder-cache checkout" in err
    assert "pip install 'encoder-cache[plot]'" not in err


def test_ctrl_c_exits_cleanly_without_a_traceback(tmp_path):
    # Python leaves SIGINT ignored when it starts so (a shell's background
    # job): the script asks for Ctrl-C's usual handler itself.
    script = (
        "import os, signal, threading, sys\n"
        "from encoder_cache.__main__ import main\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "sys.exit(main(['simulate', '--requests', '10000000', '--no-progress', '--jobs', '2']))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 130
    assert "Traceback" not in run.stderr and run.stderr.strip() == "encoder_cache simulate: interrupted"


def _live_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, parent,
    ...), or None once the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields if fields[0] != "Z" else None


def _running(pid: int) -> bool:
    return _live_stat(pid) is not None


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _live_stat(int(entry.name))) and int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from Linux's /proc")
def test_workers_stop_when_their_parent_is_killed():
    # A parent killed outright (a timeout's SIGKILL, the OOM killer) cannot
    # stop its workers; they must not run on for the rest of their runs.
    parent = subprocess.Popen(
        [sys.executable, "-m", "encoder_cache", "simulate", "--requests", "10000000", "--no-progress", "--jobs", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, "the two workers started"
        time.sleep(0.5)  # both in their runs
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while (left := {pid for pid in workers if _running(pid)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, 9)  # leave no orphan behind, whatever the assertion says
    assert not left, f"workers {sorted(left)} still run after their parent was killed"


def test_the_report_says_what_the_prefix_cache_serves_and_which_lever_matters(capsys):
    _, out, _ = simulate(capsys, "--json", "--workload", "video", "--requests", "40", "--policy", "vllm")
    data = json.loads(out)
    counters = data["headline"][0]["counters"]
    occurrences = counters["prefix_skipped_items"] + counters["cache_hits"] + counters["encoded_items"]
    assert counters["item_occurrences"] == occurrences > 0
    assert counters["prefix_served_share"] == counters["prefix_skipped_items"] / occurrences > 0.3
    without = data["no_prefix_caching"]
    assert without["variant"]["policy"] == "vllm" and without["encoder_cache_size"] == 8192
    assert without["counters"]["prefix_skipped_items"] == 0
    assert without["counters"]["encoded_embeds"] > counters["encoded_embeds"]
    text = data["recommendation_text"]
    assert f"The KV prefix cache serves {counters['prefix_served_share']:.0%} of item occurrences" in text
    assert "the prefix cache is the first lever here" in text


def _slow_engine(workload, limits, variant, *, cache_size, cost, check, progress=None):
    from encoder_cache.simulator import Counters, RunResult

    for done in range(10, 50, 10):
        time.sleep(0.15)
        if progress is not None:
            progress(done)
    return RunResult(variant, 1, cache_size, Counters(requests=workload.num_requests), 0.0, 0.0)


class _RecordingBar:
    def __init__(self) -> None:
        self.total, self.done, self.label, self.seen = 100, 0, "", []

    def update(self, done: int) -> None:
        self.seen.append(self.done + done)


def test_runs_in_worker_processes_report_progress_as_they_go():
    from types import SimpleNamespace

    from encoder_cache.simulator import SchedulerLimits, Variant
    from encoder_cache.simulator.cost import EncoderCost
    from encoder_cache.simulator.sweep import Runner

    bar = _RecordingBar()
    runner = Runner(SimpleNamespace(num_requests=50), SchedulerLimits(), EncoderCost(), False, 2, bar, _slow_engine)
    results = runner.run([(Variant(), 1000), (Variant(), 2000)])
    assert [r.encoder_cache_size for r in results] == [1000, 2000]
    assert bar.done == 100
    assert any(v % 50 for v in bar.seen), "requests finished inside a run show before the run ends"
    assert max(bar.seen) <= 100
