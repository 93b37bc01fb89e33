"""The sim's command line: its flags as declarative groups, parsed and range-checked into a
`SimConfig`.

Every knob is a flag so that a test or a gate run can build a reference and a candidate that
differ in exactly one respect (a slower ITL, a fault, another model seed) and nothing else.
Performance figures come from a named profile (``--profile``, default ``demo``); a flag given
explicitly overrides the profile's value. The flags are data (`Flag`, `FlagGroup`, `GROUPS`,
in `simengine.flags`) so the parser, its help and the groups a reader scans are one table;
the checks that argparse cannot express run after parsing and fail the way argparse does
(exit code 2).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Callable, Sequence

from simengine.config import SimConfig
from simengine.features import FEATURES
from simengine.flags import GROUPS
from simengine.profiles import DEFAULT_PROFILE, PROFILE_FIELDS, PROFILES

PROG = "python -m simengine"
DESCRIPTION = (
    "OpenAI-compatible streaming server that imitates vLLM with a toy model, a "
    "continuous-batching performance model and faults on demand."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    for group in GROUPS:
        group.add_to(parser)
    return parser


# -- parsing: what argparse cannot check, checked in the order the messages have always had ----

Require = Callable[[bool, str], None]

NON_NEGATIVE = (
    "load_s",
    "warmup_s",
    "frontend_ms",
    "ttft_ms",
    "prefill_us_per_token",
    "itl_ms",
    "itl_per_running_ms",
    "step_us_per_kv_token",
    "jitter",
    "logit_noise",
    "degrade_itl_per_min",
    "degrade_ttft_per_min",
    "kv_transfer_ms",
    "kv_transfer_us_per_token",
    "gpu_memory_gib",
    "gpu_idle_w",
    "gpu_j_per_token",
)
FRACTIONS = ("error_rate", "stream_error_rate", "hang_rate", "numeric_bug", "slow_share")
COUNTS = ("crash_after_requests", "nan_after_requests", "hang_after_tokens", "max_waiting")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse and range-check flags, failing the way argparse does (exit code 2)."""
    parser = build_parser()
    ns = parser.parse_args(argv)

    def require(ok: bool, message: str) -> None:
        if not ok:
            parser.error(message)

    profile = PROFILES[ns.profile or DEFAULT_PROFILE]
    for name in PROFILE_FIELDS:
        if getattr(ns, name) is None:
            setattr(ns, name, getattr(profile, name))
    _check_figures(ns, require)
    stalls = _check_faults(ns, require)
    _check_serving(ns, require)
    return _config(ns, stalls)


def kept_slots(slots: int, loss_pct: float) -> int:
    """Sequence slots left after ``--capacity-loss``: rounded to the nearest, at least 1."""
    return max(1, round(slots * (1.0 - loss_pct / 100.0)))


def _check_figures(ns: argparse.Namespace, require: Require) -> None:
    """The performance model and the model's sizes."""
    for name in NON_NEGATIVE:
        value = getattr(ns, name)
        require(math.isfinite(value) and value >= 0, f"{_flag(name)} must be a finite number >= 0")
    require(0 <= ns.port <= 65535, "--port must be in [0, 65535]")
    require(ns.max_model_len >= 1, "--max-model-len must be >= 1")
    require(16 <= ns.vocab_size <= 1 << 18, "--vocab-size must be in [16, 262144]")
    require(ns.tokens_per_event >= 1, "--tokens-per-event must be >= 1")
    require(ns.max_num_seqs >= 1, "--max-num-seqs must be >= 1")
    require(
        math.isfinite(ns.capacity_loss) and 0 <= ns.capacity_loss < 100,
        "--capacity-loss must be a percentage in [0, 100)",
    )
    require(ns.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1")
    require(1 <= ns.block_size <= 4096, "--block-size must be in [1, 4096]")
    if ns.num_gpu_blocks_override is not None:
        require(ns.num_gpu_blocks_override >= 1, "--num-gpu-blocks-override must be >= 1")
        ns.kv_cache_tokens = ns.num_gpu_blocks_override * ns.block_size
        require(
            ns.kv_cache_tokens >= ns.max_model_len,
            "--num-gpu-blocks-override x --block-size must be at least --max-model-len",
        )
    require(
        ns.kv_cache_tokens == 0 or ns.kv_cache_tokens >= ns.max_model_len,
        "--kv-cache-tokens must be 0 (unlimited) or at least --max-model-len",
    )


def _check_faults(ns: argparse.Namespace, require: Require) -> tuple[tuple[float, float], ...]:
    """Rates, counts, the slow share and the stalls; returns the stalls sorted, of every
    ``--stalls`` flag."""
    for name in FRACTIONS:
        value = getattr(ns, name)
        require(0.0 <= value <= 1.0, f"{_flag(name)} must be in [0, 1]")
    for name in COUNTS:
        value = getattr(ns, name)
        require(value is None or value >= 0, f"{_flag(name)} must be >= 0")
    require(
        ns.crash_after_s is None or (math.isfinite(ns.crash_after_s) and ns.crash_after_s >= 0),
        "--crash-after-s must be a finite number >= 0",
    )
    slow_factor = ns.slow_factor
    require(
        slow_factor is None or (math.isfinite(slow_factor) and slow_factor >= 1),
        f"--slow-factor must be a finite number >= 1, got {slow_factor!r}",
    )
    require(
        ns.slow_share == 0 or slow_factor is not None,
        "--slow-share needs --slow-factor K (how many times slower their TTFT is)",
    )
    require(
        slow_factor is None or ns.slow_share > 0,
        "--slow-factor has no effect without --slow-share F",
    )
    stalls = tuple(sorted(s for group in ns.stalls for s in group))
    for (a_at, a_for), (b_at, _) in itertools.pairwise(stalls):
        require(
            b_at >= a_at + a_for,
            f"--stalls overlap: {a_at:g}:{a_for:g} still stalls at {b_at:g} s",
        )
    return stalls


def _check_serving(ns: argparse.Namespace, require: Require) -> None:
    """The model's name, the connection habits and the features."""
    require(bool(ns.model), "--model must not be empty")
    timeout = ns.keep_alive_timeout
    require(
        timeout is None or (math.isfinite(timeout) and timeout > 0),
        f"--keep-alive-timeout must be a finite number of seconds > 0, got {timeout!r}",
    )
    limit = ns.max_requests_per_connection
    require(
        limit is None or limit >= 1,
        f"--max-requests-per-connection must be >= 1, got {limit!r}",
    )
    require(
        not ns.announce_keep_alive or timeout is not None or limit is not None,
        "--announce-keep-alive has nothing to announce: "
        "give --keep-alive-timeout or --max-requests-per-connection",
    )
    require(
        0 <= ns.max_logprobs <= ns.vocab_size,
        f"--max-logprobs must be in [0, --vocab-size {ns.vocab_size}], got {ns.max_logprobs}",
    )


def _config(ns: argparse.Namespace, stalls: tuple[tuple[float, float], ...]) -> SimConfig:
    """The checked flags as the one frozen config every part of the sim shares."""
    without = tuple(f for f in FEATURES if any(f in group for group in ns.without))
    return SimConfig(
        port=ns.port,
        host=ns.host,
        model=ns.model,
        profile=ns.profile or DEFAULT_PROFILE,
        max_model_len=ns.max_model_len,
        vocab_size=ns.vocab_size,
        load_s=ns.load_s,
        warmup_s=ns.warmup_s,
        seed=ns.seed,
        model_seed=ns.model_seed,
        frontend_ms=ns.frontend_ms,
        ttft_ms=ns.ttft_ms,
        prefill_us_per_token=ns.prefill_us_per_token,
        itl_ms=ns.itl_ms,
        itl_per_running_ms=ns.itl_per_running_ms,
        step_us_per_kv_token=ns.step_us_per_kv_token,
        jitter=ns.jitter,
        tokens_per_event=ns.tokens_per_event,
        max_num_seqs=kept_slots(ns.max_num_seqs, ns.capacity_loss),
        max_num_batched_tokens=ns.max_num_batched_tokens,
        kv_cache_tokens=ns.kv_cache_tokens,
        block_size=ns.block_size,
        role=ns.role,
        kv_transfer_ms=ns.kv_transfer_ms,
        kv_transfer_us_per_token=ns.kv_transfer_us_per_token,
        logit_noise=ns.logit_noise,
        numeric_bug=ns.numeric_bug,
        nan_after_requests=ns.nan_after_requests,
        crash_after_requests=ns.crash_after_requests,
        crash_after_s=ns.crash_after_s,
        error_rate=ns.error_rate,
        stream_error_rate=ns.stream_error_rate,
        hang_after_tokens=ns.hang_after_tokens,
        hang_rate=ns.hang_rate,
        hang_requests=ns.hang_requests,
        degrade_itl_per_min=ns.degrade_itl_per_min,
        slow_share=ns.slow_share,
        slow_factor=1.0 if ns.slow_factor is None else ns.slow_factor,
        stalls=stalls,
        degrade_ttft_per_min=ns.degrade_ttft_per_min,
        max_waiting=ns.max_waiting,
        shed_status=ns.shed_status,
        keep_alive_timeout_s=ns.keep_alive_timeout,
        max_requests_per_connection=ns.max_requests_per_connection,
        announce_keep_alive=ns.announce_keep_alive,
        max_logprobs=ns.max_logprobs,
        without=without,
        gpu_memory_gib=ns.gpu_memory_gib,
        gpu_idle_w=ns.gpu_idle_w,
        gpu_j_per_token=ns.gpu_j_per_token,
        gpu_xids=tuple(ns.gpu_xid),
        gpu_state_dir=ns.gpu_state_dir,
        truth_log=ns.truth_log,
        tag=ns.tag,
    )
