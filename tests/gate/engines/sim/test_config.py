"""Flag parsing: defaults match the documented ones and nonsense is refused up front."""

from __future__ import annotations

import dataclasses

import pytest

from gate.engines.sim.config import SimConfig, build_parser, parse_args


def test_defaults() -> None:
    config = parse_args(["--port", "0"])
    assert config == SimConfig(port=0)
    assert (config.host, config.model, config.max_model_len) == ("127.0.0.1", "demo-model", 4096)
    assert (config.ttft_ms, config.prefill_us_per_token, config.itl_ms) == (40.0, 50.0, 12.0)
    assert (config.itl_per_running_ms, config.jitter, config.tokens_per_event) == (0.05, 0.03, 1)
    assert (config.load_s, config.warmup_s, config.seed) == (0.3, 0.2, 0)
    assert config.crash_after_requests is None
    assert config.error_rate == 0.0


def test_every_flag_reaches_the_config() -> None:
    flags = (
        "--port 8123 --host 0.0.0.0 --model m --max-model-len 99 --vocab-size 64 --model-seed 4 "
        "--load-s 1 --warmup-s 2 --seed 5 --ttft-ms 6 --prefill-us-per-token 7 --itl-ms 8 "
        "--itl-per-running-ms 9 --jitter 0.5 --tokens-per-event 3 --max-num-seqs 2 "
        "--crash-after-requests 10 --error-rate 0.25 --tag run-1"
    )
    config = parse_args(flags.split(" "))
    assert config == SimConfig(
        port=8123, host="0.0.0.0", model="m", max_model_len=99, vocab_size=64, model_seed=4,
        load_s=1, warmup_s=2, seed=5, ttft_ms=6, prefill_us_per_token=7, itl_ms=8,
        itl_per_running_ms=9, jitter=0.5, tokens_per_event=3, max_num_seqs=2,
        crash_after_requests=10, error_rate=0.25, tag="run-1",
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
    ],
)
def test_bad_flags_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


def test_help_mentions_every_flag() -> None:
    text = build_parser().format_help()
    for flag in ("--crash-after-requests", "--error-rate", "--tag", "--tokens-per-event"):
        assert flag in text
