"""Flag parsing: defaults match the documented ones, profiles load, nonsense is refused."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from simengine.cli import build_parser, parse_args
from simengine.config import SimConfig
from simengine.launch import SimPool
from simengine.profiles import DEFAULT_PROFILE, PROFILE_FIELDS, PROFILES


def test_defaults() -> None:
    config = parse_args(["--port", "0"])
    assert config == SimConfig(port=0)
    assert (config.host, config.model, config.max_model_len) == ("127.0.0.1", "demo-model", 4096)
    assert (config.ttft_ms, config.prefill_us_per_token, config.itl_ms) == (40.0, 50.0, 12.0)
    assert (config.itl_per_running_ms, config.jitter, config.tokens_per_event) == (0.05, 0.03, 1)
    assert (config.load_s, config.warmup_s, config.seed) == (0.3, 0.2, 0)
    assert config.crash_after_requests is None
    assert config.error_rate == 0.0
    assert config.truth_log is None
    assert (config.role, config.kv_transfer_ms, config.kv_transfer_us_per_token) == ("both", 2, 3)


def test_sim_config_defaults_are_the_default_profile() -> None:
    demo = PROFILES[DEFAULT_PROFILE]
    config = SimConfig(port=0)
    for name in PROFILE_FIELDS:
        assert getattr(config, name) == getattr(demo, name), name


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_loads_and_flags_override_it(name: str) -> None:
    profile = PROFILES[name]
    config = parse_args(["--port", "0", "--profile", name])
    assert config.profile == name
    for field in PROFILE_FIELDS:
        assert getattr(config, field) == getattr(profile, field), field
    overridden = parse_args(["--port", "0", "--profile", name, "--itl-ms", "3", "--load-s", "0"])
    assert (overridden.itl_ms, overridden.load_s) == (3.0, 0.0)
    assert overridden.max_num_seqs == profile.max_num_seqs
    assert profile.description


def test_hardware_profiles_are_plausible() -> None:
    small, large = PROFILES["llama-3.1-8b-h200"], PROFILES["llama-3.1-70b-h200x4"]
    assert 3 <= small.itl_ms < large.itl_ms <= 20
    assert small.prefill_us_per_token < large.prefill_us_per_token
    assert small.load_s < large.load_s
    assert small.kv_cache_tokens >= small.max_model_len
    assert PROFILES["tiny"].load_s == PROFILES["tiny"].warmup_s == 0


def test_every_flag_reaches_the_config() -> None:
    flags = (
        "--port 8123 --host 0.0.0.0 --model m --profile tiny --max-model-len 99 --vocab-size 64 "
        "--model-seed 4 --load-s 1 --warmup-s 2 --seed 5 --frontend-ms 0.5 --ttft-ms 6 "
        "--prefill-us-per-token 7 --itl-ms 8 --itl-per-running-ms 9 --step-us-per-kv-token 0.1 "
        "--jitter 0.5 --tokens-per-event 3 --max-num-seqs 2 --max-num-batched-tokens 50 "
        "--kv-cache-tokens 100 --logit-noise 0.1 --numeric-bug 0.01 --nan-after-requests 7 "
        "--crash-after-requests 10 --crash-after-s 30 --error-rate 0.25 "
        "--stream-error-rate 0.125 --hang-after-tokens 3 --hang-rate 0.5 --hang-requests 2,4-5 "
        "--degrade-itl-per-min 20 --max-waiting 8 --shed-status 503 --truth-log t.jsonl "
        "--slow-share 0.03 --slow-factor 4 --stalls 40:3,10:5 --stalls 60:1 "
        "--degrade-ttft-per-min 240 "
        "--role decode --kv-transfer-ms 4 --kv-transfer-us-per-token 0.5 --tag run-1"
    )
    config = parse_args(flags.split(" "))
    assert config == SimConfig(
        port=8123, host="0.0.0.0", model="m", profile="tiny", max_model_len=99, vocab_size=64,
        model_seed=4, load_s=1, warmup_s=2, seed=5, frontend_ms=0.5, ttft_ms=6,
        prefill_us_per_token=7, itl_ms=8, itl_per_running_ms=9, step_us_per_kv_token=0.1,
        jitter=0.5, tokens_per_event=3, max_num_seqs=2, max_num_batched_tokens=50,
        kv_cache_tokens=100, logit_noise=0.1, numeric_bug=0.01, nan_after_requests=7,
        crash_after_requests=10, crash_after_s=30, error_rate=0.25, stream_error_rate=0.125,
        hang_after_tokens=3, hang_rate=0.5, hang_requests=(2, 4, 5), degrade_itl_per_min=20,
        max_waiting=8, shed_status=503, truth_log="t.jsonl", role="decode", kv_transfer_ms=4,
        kv_transfer_us_per_token=0.5, tag="run-1", slow_share=0.03, slow_factor=4,
        stalls=((10, 5), (40, 3), (60, 1)), degrade_ttft_per_min=240,
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--port", "-1"],
        ["--port", "0", "--itl-ms", "-1"],
        ["--port", "0", "--jitter", "nan"],
        ["--port", "0", "--error-rate", "1.5"],
        ["--port", "0", "--tokens-per-event", "0"],
        ["--port", "0", "--crash-after-requests", "-1"],
        ["--port", "0", "--vocab-size", "8"],
        ["--port", "0", "--profile", "gpt-5"],
        ["--port", "0", "--kv-cache-tokens", "10"],
        ["--port", "0", "--shed-status", "500"],
        ["--port", "0", "--hang-requests", "3-1"],
        ["--port", "0", "--numeric-bug", "2"],
        ["--port", "0", "--crash-after-s", "inf"],
        ["--port", "0", "--role", "router"],
        ["--port", "0", "--kv-transfer-ms", "-1"],
        ["--port", "0", "--kv-transfer-us-per-token", "nan"],
        ["--port", "0", "--degrade-ttft-per-min", "-5"],
        ["--port", "0", "--stalls", "10"],
        ["--port", "0", "--stalls", "10:0"],
        ["--port", "0", "--stalls", "-1:2"],
        ["--port", "0", "--stalls", "10:inf"],
        ["--port", "0", "--capacity-loss", "100"],
        ["--port", "0", "--capacity-loss", "-1"],
        ["--port", "0", "--capacity-loss", "nan"],
    ],
)
def test_bad_flags_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--slow-share", "0.1"], "--slow-share needs --slow-factor"),
        (["--slow-factor", "4"], "--slow-factor has no effect without --slow-share"),
        (["--slow-share", "1.5", "--slow-factor", "4"], "--slow-share must be in [0, 1]"),
        (["--slow-share", "0.1", "--slow-factor", "0.5"], "--slow-factor must be a finite"),
        (["--slow-share", "0.1", "--slow-factor", "nan"], "--slow-factor must be a finite"),
        (["--stalls", "10:5,12:1"], "--stalls overlap: 10:5 still stalls at 12 s"),
        (["--stalls", "10"], "argument --stalls: not AT:FOR"),
        (["--stalls", "10:0"], "argument --stalls: AT must be >= 0 and FOR > 0"),
        (["--degrade-ttft-per-min", "inf"], "--degrade-ttft-per-min must be a finite number"),
    ],
)
def test_latency_fault_flags_name_themselves_when_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--port", "0", *argv])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_latency_faults_are_off_by_default() -> None:
    config = parse_args(["--port", "0"])
    assert (config.slow_share, config.slow_factor, config.stalls) == (0.0, 1.0, ())
    assert config.degrade_ttft_per_min == 0.0
    assert config.cost_model().degrade_ttft_per_min == 0.0


def test_help_mentions_every_flag() -> None:
    text = build_parser().format_help()
    for flag in (
        "--crash-after-requests", "--error-rate", "--tag", "--tokens-per-event", "--profile",
        "--crash-after-s", "--hang-after-tokens", "--stream-error-rate", "--degrade-itl-per-min",
        "--max-waiting", "--shed-status", "--truth-log", "--logit-noise", "--numeric-bug",
        "--nan-after-requests", "--max-num-batched-tokens", "--kv-cache-tokens", "--role",
        "--kv-transfer-ms", "--kv-transfer-us-per-token", "--slow-share", "--slow-factor",
        "--stalls", "--degrade-ttft-per-min",
    ):  # fmt: skip
        assert flag in text
    for name in PROFILES:
        assert name in text


def test_a_hardware_profile_serves(launcher: SimPool) -> None:
    sim = launcher.start("--profile", "llama-3.1-8b-h200", "--load-s", "0", "--warmup-s", "0")
    card = httpx.get(sim.url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == 131_072
    body = {"prompt": "a b c", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(sim.url + "/v1/completions", json=body, timeout=10).json()
    assert resp["usage"]["completion_tokens"] == 5
    metrics = httpx.get(sim.url + "/metrics").text
    assert "vllm:kv_cache_usage_perc" in metrics


def test_kv_blocks_as_vllm_states_them() -> None:
    """--num-gpu-blocks-override x --block-size is the KV cache in tokens, as vLLM's flags."""
    cfg = parse_args(["--port", "0", "--num-gpu-blocks-override", "300", "--block-size", "32"])
    assert (cfg.kv_cache_tokens, cfg.block_size) == (9600, 32)
    assert parse_args(["--port", "0"]).block_size == 16


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--block-size", "0"], "--block-size must be in [1, 4096]"),
        (["--num-gpu-blocks-override", "0"], "--num-gpu-blocks-override must be >= 1"),
        (
            ["--num-gpu-blocks-override", "10", "--max-model-len", "1024"],
            "--num-gpu-blocks-override x --block-size must be at least --max-model-len",
        ),
    ],
)
def test_kv_block_flags_name_themselves_when_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--port", "0", *argv])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_capacity_loss_keeps_a_share_of_the_sequence_slots() -> None:
    """`--capacity-loss PCT` (issue 33's calibration): (100 - PCT)% of --max-num-seqs, rounded,
    at least 1; every other figure as it was, so a batch within the smaller limit runs alike."""
    plain = parse_args(["--port", "0", "--max-num-seqs", "20", "--itl-ms", "25"])
    lossy = parse_args(
        ["--port", "0", "--max-num-seqs", "20", "--itl-ms", "25", "--capacity-loss", "15"]
    )
    assert lossy.max_num_seqs == 17 and plain.max_num_seqs == 20
    assert dataclasses.replace(lossy, max_num_seqs=20) == plain
    assert (
        parse_args(["--port", "0", "--max-num-seqs", "1", "--capacity-loss", "90"]).max_num_seqs
        == 1
    )
    assert (
        parse_args(["--port", "0", "--profile", "tiny", "--capacity-loss", "50"]).max_num_seqs == 32
    )
