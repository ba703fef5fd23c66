"""The simulator's host-memory tier: it changes nothing when it holds nothing,
a large one turns every re-encode into a load, its decisions are the block
cache's (and vLLM's under fifo), and the command line's checks."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from host_tier_twin import TwinBlockCache

from encoder_cache import HOST_POLICIES, HostBlockCache
from encoder_cache.__main__ import main
from encoder_cache.simulator import SchedulerLimits, Variant, WorkloadConfig, generate, simulate
from encoder_cache.simulator.host_tier import HostTier, HostTierModel

BYTES_PER_EMBED = 7168
#: Chat re-encodes images its sessions' earlier turns sent once the small GPU cache lost them.
CHAT = WorkloadConfig(kind="chat", requests=120, think_steps=40.0, seed=3)
POPULAR = WorkloadConfig(kind="popular", requests=120, catalogue=60, seed=5)
LIMITS = SchedulerLimits(max_num_batched_tokens=4096, kv_capacity=32768)


def tier(embeds: int, policy: str = "fifo") -> HostTier:
    return HostTier(embeds * BYTES_PER_EMBED, policy, BYTES_PER_EMBED)


class _NeverReady:
    """A host region with no room: every save fails, so nothing is ever loaded."""

    def get(self, key):
        return None

    def alloc(self, key, n_blocks, shape=None):
        return None


@pytest.mark.parametrize("config", [CHAT, POPULAR], ids=["chat", "popular"])
@pytest.mark.parametrize("check", [False, True])
def test_a_host_tier_that_holds_nothing_changes_nothing(config, check):
    workload = generate(config)
    alone = simulate(workload, LIMITS, Variant(), check=check)
    host = HostTierModel(tier(1 << 20), cache=_NeverReady())
    beside = simulate(workload, LIMITS, Variant(), check=check, host=host)
    assert asdict(beside.counters) == asdict(alone.counters)
    assert alone.host is None
    assert host.counters.loads == 0 and host.counters.saves == 0
    assert host.counters.save_failures == host.counters.misses == alone.counters.encoded_items > 0


@pytest.mark.parametrize("config", [CHAT, POPULAR], ids=["chat", "popular"])
@pytest.mark.parametrize("policy", HOST_POLICIES)
def test_a_large_host_tier_turns_every_re_encode_into_a_load(config, policy):
    workload = generate(config)
    alone = simulate(workload, LIMITS, Variant())
    assert alone.counters.recomputed_items > 0, "the workload must re-encode for the test to mean anything"
    result = simulate(workload, LIMITS, Variant(host=tier(1 << 22, policy)), check=True)
    c, h = result.counters, result.host
    assert h is not None
    assert c.recomputed_items == 0
    assert h.loads > 0 and h.evictions == 0 and h.save_failures == 0
    # Each identifier is encoded once and saved once; every later miss of the GPU cache is a load.
    assert c.encoded_items == h.saves == h.misses
    assert h.saved_embeds == c.encoded_embeds
    assert h.hit_rate == h.loads / (h.loads + h.misses)
    # A load takes no encoder budget, so the schedule may differ, but never the work: no more encoded than alone.
    assert c.encoded_embeds <= alone.counters.encoded_embeds
    assert c.encoded_embeds + h.loaded_embeds >= alone.counters.encoded_embeds - alone.counters.recomputed_embeds


def _decisions(workload, cache, policy, blocks):
    seen: list[tuple[str, str]] = []
    model = HostTierModel(tier(blocks, policy), cache=cache, on_decision=lambda what, key: seen.append((what, key)))
    result = simulate(workload, LIMITS, Variant(), host=model)
    return seen, asdict(result.counters), model.counters


def _small_region(workload) -> int:
    """A region of a few of the workload's largest items: it must evict."""
    return 10 * max(workload.max_embeds_per_item().values())


@pytest.mark.parametrize("config", [CHAT, POPULAR], ids=["chat", "popular"])
@pytest.mark.parametrize("policy", HOST_POLICIES)
def test_the_simulated_tier_decides_as_the_block_cache_twin(config, policy):
    workload = generate(config)
    blocks = _small_region(workload)
    ours = _decisions(workload, HostBlockCache(blocks, policy=policy), policy, blocks)
    twin = _decisions(workload, TwinBlockCache(blocks, policy=policy), policy, blocks)
    assert ours[0] == twin[0] and ours[1] == twin[1]
    assert ours[2].evictions > 0 and ours[2].loads > 0, "the region must be small enough to evict, big enough to load"
    # The default cache is HostBlockCache under the tier's policy: the same run.
    default = simulate(workload, LIMITS, Variant(host=tier(blocks, policy)))
    assert asdict(default.counters) == ours[1] and default.host == ours[2]


@pytest.mark.vllm
@pytest.mark.parametrize("config", [CHAT, POPULAR], ids=["chat", "popular"])
def test_fifo_decides_as_vllms_embedding_cache(config):
    embedding_cache = pytest.importorskip("vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache")
    workload = generate(config)
    blocks = _small_region(workload)
    ours = _decisions(workload, HostBlockCache(blocks, policy="fifo"), "fifo", blocks)
    vllm = _decisions(workload, embedding_cache.EmbeddingCache(blocks), "fifo", blocks)
    assert ours[0] == vllm[0] and ours[1] == vllm[1]
    assert ours[2].loads > 0 and ours[2].evictions > 0


def test_host_tier_values_are_checked():
    with pytest.raises(ValueError, match="policy"):
        HostTier(1 << 30, "lru")
    with pytest.raises(ValueError, match="size_bytes"):
        HostTier(0)
    with pytest.raises(ValueError, match="holds no block"):
        HostTier(100, "fifo", 7168)
    workload = generate(CHAT)
    small = max(workload.max_embeds_per_item().values()) - 1
    with pytest.raises(ValueError, match="cannot hold the largest item"):
        simulate(workload, LIMITS, Variant(host=tier(small)))
    with pytest.raises(ValueError, match="oracle"):
        simulate(workload, LIMITS, Variant("oracle", False, "python", host=tier(1 << 20)))


FAST = ["--requests", "30", "--no-progress", "--jobs", "1", "--workload", "chat"]


def _cli(capsys, *argv):
    try:
        code = main(["simulate", *FAST, *argv])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host-policy", "fifo"], "--host-policy needs --host-cache-gib"),
        (["--host-cache-gib", "4", "--host-policy", "lru"], "--host-policy lru: unknown"),
        (["--host-cache-gib", "0"], "--host-cache-gib: expected GiB sizes > 0"),
        (["--host-cache-gib", "-1"], "--host-cache-gib: expected GiB sizes > 0"),
        (["--host-cache-gib", "four"], "--host-cache-gib: expected GiB sizes > 0"),
        (["--host-cache-gib", "nan"], "--host-cache-gib: expected GiB sizes > 0"),
        (["--host-cache-gib", "0.000001"], "holds no embedding"),
        (["--host-cache-gib", "0.001"], "fewer than the largest item"),
        (["--host-cache-gib", "4", "--behaviour", "fixed,prefix"], "drop --host-cache-gib"),
        (["--host-cache-gib", "4", "--export-trace", "out.jsonl"], "--export-trace only writes"),
    ],
)
def test_cli_rejects_bad_host_tier_options(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_a_host_tier_is_refused_outside_the_built_in_model():
    import argparse

    from encoder_cache.simulator.cli import UsageError, _host_tiers

    args = argparse.Namespace(host_cache_gib=[4.0], host_policy=None, behaviour=None, engine="vllm")
    with pytest.raises(UsageError, match="drop --engine vllm"):
        _host_tiers(args, BYTES_PER_EMBED, "test")
    args.engine = "model"
    assert _host_tiers(args, BYTES_PER_EMBED, "test") == ([4 << 30], list(HOST_POLICIES))


def test_cli_without_a_host_tier_says_nothing_of_one(capsys):
    code, out, _ = _cli(capsys, "--policy", "vllm")
    assert code == 0
    assert "host" not in out.lower()
    code, out, _ = _cli(capsys, "--policy", "vllm", "--json")
    data = json.loads(out)
    assert "host_tier" not in data and all("host" not in run["variant"] for run in data["headline"])


def test_cli_shows_the_host_tiers_and_ends_with_the_connector_config(capsys):
    code, out, err = _cli(capsys, "--requests", "200", "--policy", "vllm", "--host-cache-gib", "0.5,2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    table = [line.split() for line in lines if line.startswith("8,192 ") and ("MiB " in line or "GiB " in line)]
    shown = {(row[1] + " " + row[2], row[3]) for row in table if row[3] in HOST_POLICIES}
    assert shown == {(s, p) for s in ("512.0 MiB", "2.0 GiB") for p in HOST_POLICIES}
    host_line = next(line for line in lines if line.startswith("Host tier: "))
    config = json.loads(lines[-1].removeprefix("--ec-transfer-config ").strip("'"))
    assert config["ec_connector"] == "HostTierConnector" and config["ec_role"] == "ec_both"
    assert config["ec_connector_module_path"] == "encoder_cache.vllm"
    extra = config["ec_connector_extra_config"]
    assert extra["ec_cpu_policy"] in HOST_POLICIES and extra["ec_cpu_bytes"] > 0
    assert f"with policy {extra['ec_cpu_policy']}" in host_line


def test_the_host_recommendation_does_not_depend_on_the_sizes_shown(capsys):
    runs = []
    for sizes in ("0.5", "1,8", "3"):
        code, out, _ = _cli(capsys, "--requests", "200", "--policy", "vllm", "--json", "--host-cache-gib", sizes)
        assert code == 0
        runs.append(json.loads(out)["host_tier"]["recommendation"])
    assert runs[0] is not None and runs[0] == runs[1] == runs[2]
