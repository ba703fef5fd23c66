"""``python -m encoder_cache simulate``: options, output formats, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from encoder_cache.__main__ import main
from encoder_cache.simulator.cli import Progress

FAST = ["--requests", "30", "--no-progress"]


def simulate(capsys, *argv):
    code = main(["simulate", *FAST, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_variants_table(capsys):
    code, out, err = simulate(capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("workload chat: 30 requests, seed 0")
    assert "encoded embeds" in out and "bookkeeping us/step" in out
    assert [line.split()[0] for line in lines if line.split()[:1] and line.split()[1:2] == ["30"]] == [
        "rust-fixed",
        "python-fixed",
        "python-prefix",
    ]
    assert "counters identical" in out
    assert "python-prefix vs python-fixed" in out


def test_json_separates_counters_from_timings(capsys):
    argv = ["--json", "--workload", "mix", "--frames", "10:20", "--behaviour", "fixed,scan", "--seed", "7"]
    _, out, _ = simulate(capsys, *argv)
    first = json.loads(out)
    _, again, _ = simulate(capsys, *argv)
    second = json.loads(again)
    assert first["workload"]["kind"] == "mix" and first["workload"]["frames"] == [10, 20]
    assert [v["name"] for v in first["variants"]] == ["rust-fixed", "python-fixed", "python-scan"]
    for a, b in zip(first["variants"], second["variants"]):
        assert a["counters"] == b["counters"]
        assert set(a["timings"]) == {"bookkeeping_seconds", "bookkeeping_us_per_step", "wall_seconds"}
    assert first["variants"][0]["counters"]["requests"] == 30


def test_options_reach_the_run(capsys):
    argv = [
        "--json",
        "--impl",
        "python",
        "--behaviour",
        "fixed",
        "--max-num-batched-tokens",
        "4096",
        "--encoder-cache-size",
        "9000",
        "--max-num-encoder-input-tokens",
        "3000",
        "--image-embeds",
        "300",
    ]
    _, out, _ = simulate(capsys, *argv)
    data = json.loads(out)
    assert data["encoder_cache_size"] == 9000
    assert data["encoder_compute_budget"] == 3000
    assert data["limits"]["max_num_batched_tokens"] == 4096
    assert data["workload"]["image_embeds"] == [300, 300]
    assert [v["name"] for v in data["variants"]] == ["python-fixed"]


def test_plot_writes_a_png(capsys, tmp_path):
    path = tmp_path / "variants.png"
    code, out, _ = simulate(capsys, "--plot", str(path))
    assert code == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {path}" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "requests must be > 0"),
        (["--requests", "many"], "invalid int value"),
        (["--workload", "audio"], "invalid choice"),
        (["--impl", "java"], "expected a comma list of rust, python"),
        (["--behaviour", ""], "expected a comma list"),
        (["--impl", "rust", "--behaviour", "prefix"], "rust is fixed only"),
        (["--impl", "rust", "--behaviour", "fixed,scan"], "--behaviour scan has no variant"),
        (["--image-embeds", "900:100"], "image_embeds must be a range"),
        (["--image-embeds", "a:b"], "expected MIN:MAX or N"),
        (["--mix", "1:2"], "expected CHAT:VIDEO:POPULAR"),
        (["--repeat-prob", "2"], "repeat_prob must be in [0, 1]"),
        (["--kv-capacity", "500"], "tokens of KV cache"),
        (["--max-num-seqs", "-1"], "max_num_seqs must be > 0"),
        (["--plot", "/no/such/dir/plot.png"], "--plot: no directory"),
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
    bar.label = "python-fixed"
    bar.update(5)
    assert stream.getvalue() == "\r[" + "#" * 15 + " " * 15 + "]  50% python-fixed"
    bar.close()
    assert stream.getvalue().endswith("\r\x1b[K")


def test_progress_bar_waits_for_long_runs():
    stream = io.StringIO()
    bar = Progress(total=10, stream=stream, delay=60.0)
    bar.update(5)
    bar.close()
    assert stream.getvalue() == ""


def test_end_to_end_command():
    """The README's command, as a subprocess, on a small scale."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "encoder_cache",
            "simulate",
            "--requests",
            "40",
            "--workload",
            "mix",
            "--frames",
            "10:30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # not a terminal: no progress bar
    assert "rust-fixed" in run.stdout and "python-prefix" in run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "encoder_cache", "simulate", "--turns", "3:1"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == "encoder_cache simulate: error: turns must be a range MIN:MAX with 0 <= MIN <= MAX, got 3:1"
    )
