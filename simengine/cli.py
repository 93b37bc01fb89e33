"""The sim's command line: its flags as declarative groups, parsed and range-checked into a
`SimConfig`.

Every knob is a flag so that a test or a gate run can build a reference and a candidate that
differ in exactly one respect (a slower ITL, a fault, another model seed) and nothing else.
Performance figures come from a named profile (``--profile``, default ``demo``); a flag given
explicitly overrides the profile's value. The flags are data (`Flag`, `FlagGroup`, `GROUPS`)
so the parser, its help and the groups a reader scans are one table; the checks that argparse
cannot express run after parsing and fail the way argparse does (exit code 2).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simengine.config import ROLES, SimConfig
from simengine.features import DEFAULT_MAX_LOGPROBS, FEATURES, Feature, parse_features
from simengine.profiles import DEFAULT_PROFILE, PROFILE_FIELDS, PROFILES

PROG = "python -m simengine"
DESCRIPTION = (
    "OpenAI-compatible streaming server that imitates vLLM with a toy model, a "
    "continuous-batching performance model and faults on demand."
)


# -- argument types: argparse calls them, a bad value is argparse's usage error -----------------


def _request_list(text: str) -> tuple[int, ...]:
    """``"3,5-7"`` -> (3, 5, 6, 7): generation request numbers, counted from 1."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a request number or range: {part!r}") from None
        if lo < 1 or hi < lo or hi - lo > 1_000_000:
            raise argparse.ArgumentTypeError(f"bad request range: {part!r}")
        out.extend(range(lo, hi + 1))
    return tuple(sorted(set(out)))


def _stalls(text: str) -> tuple[tuple[float, float], ...]:
    """``"10:5,40:3"`` -> ((10.0, 5.0), (40.0, 3.0)): stalls as (at, for) seconds."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        at, sep, length = part.partition(":")
        try:
            start, dur = float(at), float(length)
        except ValueError:
            start = dur = math.nan
        if not sep or not math.isfinite(start) or not math.isfinite(dur):
            raise argparse.ArgumentTypeError(f"not AT:FOR (seconds, e.g. 10:5): {part!r}")
        if start < 0 or dur <= 0:
            raise argparse.ArgumentTypeError(f"AT must be >= 0 and FOR > 0 seconds, got {part!r}")
        out.append((start, dur))
    if not out:
        raise argparse.ArgumentTypeError("no AT:FOR given")
    return tuple(out)


def _features(text: str) -> tuple[Feature, ...]:
    try:
        return parse_features(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _profile_help() -> str:
    lines = [f"{name}: {p.description}" for name, p in PROFILES.items()]
    return "performance profile (default demo); " + "; ".join(lines)


# -- the flags ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag as `add_argument` takes it. A field left at None (or False) is not passed, so
    argparse's own default stands: ``default=None`` and no default are the same to it."""

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: Sequence[Any] | None = None
    action: str | None = None
    required: bool = False

    def add_to(self, group: argparse._ActionsContainer) -> None:
        given = {
            "type": self.type,
            "default": self.default,
            "metavar": self.metavar,
            "choices": self.choices,
            "action": self.action,
            "required": self.required or None,
        }
        group.add_argument(
            self.name, help=self.help, **{k: v for k, v in given.items() if v is not None}
        )


@dataclass(frozen=True, slots=True)
class FlagGroup:
    """A titled group of the help; ``title=None`` is the parser's own ("options")."""

    title: str | None
    flags: tuple[Flag, ...]
    description: str | None = None

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.title is None:
            target: argparse._ActionsContainer = parser
        else:
            target = parser.add_argument_group(self.title, self.description)
        for flag in self.flags:
            flag.add_to(target)


NETWORK = FlagGroup(
    "network",
    (
        Flag("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"),
        Flag(
            "--port",
            type=int,
            required=True,
            help="port to bind; 0 picks a free port, announced on stdout",
        ),
    ),
)

CONNECTIONS = FlagGroup(
    "connections",
    (
        Flag(
            "--keep-alive-timeout",
            type=float,
            metavar="T",
            help=(
                "close a connection idle for T seconds after its last response (uvicorn's "
                "timeout_keep_alive, 5 s under vLLM; llama.cpp's server: 5 s)"
            ),
        ),
        Flag(
            "--max-requests-per-connection",
            type=int,
            metavar="N",
            help="close a connection once it has served N requests (llama.cpp's server: 100)",
        ),
        Flag(
            "--announce-keep-alive",
            action="store_true",
            help=(
                "say so as llama.cpp's server does: 'Keep-Alive: timeout=T, max=N' on every "
                "response, 'Connection: close' on a connection's last; without it the server "
                "is silent as uvicorn is: idle connections close unannounced, and the request "
                "after a connection's N-th is closed unanswered (the close crossing it on the "
                "wire)"
            ),
        ),
    ),
    "how the server ends kept-alive connections; without these flags it never does",
)

MODEL = FlagGroup(
    "model",
    (
        Flag("--model", default="demo-model", help="served model id"),
        Flag("--max-model-len", type=int, help="context window in tokens (profile)"),
        Flag("--vocab-size", type=int, default=4096, help="toy vocabulary size"),
        Flag(
            "--model-seed",
            type=int,
            default=0,
            help="seed of the toy weights; equal seeds give identical greedy outputs",
        ),
    ),
)

PERFORMANCE = FlagGroup(
    "performance model",
    (
        Flag("--profile", choices=sorted(PROFILES), help=_profile_help()),
        Flag("--load-s", type=float, help="seconds before the port opens"),
        Flag("--warmup-s", type=float, help="seconds /health answers 503 after the port opens"),
        Flag("--seed", type=int, default=0, help="seed of jitter, faults and variants"),
        Flag(
            "--frontend-ms",
            type=float,
            help="delay before a request reaches the scheduler (API server, tokenisation)",
        ),
        Flag(
            "--ttft-ms",
            type=float,
            help=(
                "floor on time to first token, plus --prefill-us-per-token per prompt token; "
                "per-request latency outside the batch, so it never changes ITL; 0 disables it"
            ),
        ),
        Flag(
            "--prefill-us-per-token",
            type=float,
            help=(
                "compute time per token of a step, in microseconds (steps are max(memory, compute))"
            ),
        ),
        Flag("--itl-ms", type=float, help="memory time of a step: the decode step at batch 1"),
        Flag(
            "--itl-per-running-ms",
            type=float,
            help="CPU time per additional sequence in a step (sampling, scheduling)",
        ),
        Flag(
            "--step-us-per-kv-token",
            type=float,
            help="memory time per context token attended over, in microseconds",
        ),
        Flag("--jitter", type=float, help="sigma of the lognormal step-time multiplier"),
        Flag(
            "--tokens-per-event",
            type=int,
            default=1,
            help="tokens carried by each stream event (buffered over that many steps)",
        ),
        Flag(
            "--max-num-seqs",
            type=int,
            help="sequences in the running batch; later ones wait (vllm:num_requests_waiting)",
        ),
        Flag(
            "--max-num-batched-tokens",
            type=int,
            help="token budget of one step; longer prompts are prefilled in chunks",
        ),
        Flag(
            "--kv-cache-tokens",
            type=int,
            help=(
                "KV cache size in tokens; when full the newest sequence is preempted; 0 = unlimited"
            ),
        ),
        Flag(
            "--block-size",
            type=int,
            default=16,
            help="tokens per KV block, as vLLM's --block-size (vllm:cache_config_info)",
        ),
        Flag(
            "--num-gpu-blocks-override",
            type=int,
            help=(
                "KV cache size in blocks, as vLLM's flag of that name: sets --kv-cache-tokens to "
                "blocks x --block-size (a candidate with fewer blocks preempts at a peak)"
            ),
        ),
    ),
    "flags without a default here take the profile's value",
)

DISAGGREGATED = FlagGroup(
    "disaggregated prefill and decode",
    (
        Flag(
            "--role",
            choices=ROLES,
            default="both",
            help=(
                "both (default): a whole engine, kv_transfer_params ignored; prefill: answers "
                "a request with kv_transfer_params.do_remote_decode with the KV hand-off in "
                "its kv_transfer_params; decode: takes a request with the hand-off "
                "(do_remote_prefill), waits the KV transfer and decodes without prefilling"
            ),
        ),
        Flag(
            "--kv-transfer-ms",
            type=float,
            default=2.0,
            metavar="MS",
            help="decode: fixed wait for a remote prefill's KV (default 2)",
        ),
        Flag(
            "--kv-transfer-us-per-token",
            type=float,
            default=3.0,
            metavar="US",
            help="decode: added wait per prompt token of the transferred KV (default 3)",
        ),
    ),
    "one worker group of a two-group engine, behind python -m simengine.router",
)

NUMERICS = FlagGroup(
    "numeric variants (candidate models)",
    (
        Flag(
            "--logit-noise",
            type=float,
            default=0.0,
            metavar="SIGMA",
            help="Gaussian noise added to every logit: benign numerics, flips near-ties only",
        ),
        Flag(
            "--numeric-bug",
            type=float,
            default=0.0,
            metavar="RATE",
            help=(
                "fraction of positions whose top token is swapped with one ranked >= 5: a real bug"
            ),
        ),
        Flag(
            "--nan-after-requests",
            type=int,
            metavar="N",
            help="logprobs of generation requests after the N-th are NaN",
        ),
    ),
)

# Faults: failures (crashes, errors, hangs) first, then latency that is not a steady shift and
# load shedding, in the order the help has always listed them.
_FAILURES = (
    Flag(
        "--crash-after-requests",
        type=int,
        metavar="N",
        help="exit with code 1 when generation request N+1 starts streaming",
    ),
    Flag(
        "--crash-after-s",
        type=float,
        metavar="T",
        help="exit with code 1 T seconds after becoming ready, mid-stream or not",
    ),
    Flag(
        "--error-rate",
        type=float,
        default=0.0,
        help="fraction of generation requests answered with HTTP 500",
    ),
    Flag(
        "--stream-error-rate",
        type=float,
        default=0.0,
        help='fraction of streams that send an {"error": ...} event mid-stream, then [DONE]',
    ),
    Flag(
        "--hang-after-tokens",
        type=int,
        metavar="K",
        help="selected streams stop sending after K tokens but keep the connection open",
    ),
    Flag(
        "--hang-rate",
        type=float,
        default=1.0,
        help="fraction of streams that hang (with --hang-after-tokens; default all)",
    ),
    Flag(
        "--hang-requests",
        type=_request_list,
        default=(),
        metavar="LIST",
        help="only these generation requests hang, e.g. 3,5-7 (counted from 1; overrides rate)",
    ),
)
_SLOWDOWNS = (
    Flag(
        "--degrade-itl-per-min",
        type=float,
        default=0.0,
        metavar="PCT",
        help="step time grows by PCT%% of its start value per minute since ready",
    ),
    Flag(
        "--degrade-ttft-per-min",
        type=float,
        default=0.0,
        metavar="PCT",
        help=(
            "time to first token grows by PCT%% per minute since ready: a request arriving "
            "t minutes in waits PCT/100 * t times its TTFT more before its first token (its "
            "later tokens shifted alike, so ITL is unchanged)"
        ),
    ),
    Flag(
        "--capacity-loss",
        type=float,
        default=0.0,
        metavar="PCT",
        help=(
            "keep (100 - PCT)%% of the sequence slots (--max-num-seqs, rounded, at least 1): "
            "where slots bound throughput the sustainable rate falls by about PCT%%, while a "
            "batch that fits the smaller limit runs exactly as before, so latency at low load "
            "is unchanged (the capacity scenario's calibration)"
        ),
    ),
    Flag(
        "--slow-share",
        type=float,
        default=0.0,
        metavar="F",
        help=(
            "fraction of generation requests (drawn by --seed) whose time to first token is "
            "multiplied by --slow-factor: each waits (K-1) times its TTFT more before its "
            "first token, later tokens shifted alike (ITL unchanged)"
        ),
    ),
    Flag(
        "--slow-factor",
        type=float,
        metavar="K",
        help="TTFT multiplier of the --slow-share requests (needed with it; >= 1)",
    ),
    Flag(
        "--stalls",
        type=_stalls,
        action="append",
        default=[],
        metavar="AT:FOR[,AT:FOR]",
        help=(
            "the scheduler stops stepping for FOR seconds, AT seconds after the first "
            "generation request arrived, as a GC pause or a recompilation stops an engine: "
            "running and waiting requests are all delayed, none dropped; new requests are "
            "still taken in (repeatable, or a comma list: 10:5,40:3)"
        ),
    ),
    Flag(
        "--max-waiting",
        type=int,
        metavar="N",
        help="shed new requests while N requests wait for a free sequence slot",
    ),
    Flag(
        "--shed-status",
        type=int,
        choices=(429, 503),
        default=429,
        help="status of shed requests (default 429)",
    ),
)
FAULTS = FlagGroup("faults", _FAILURES + _SLOWDOWNS)

FEATURE_FLAGS = FlagGroup(
    "features",
    (
        Flag(
            "--max-logprobs",
            type=int,
            default=DEFAULT_MAX_LOGPROBS,
            metavar="N",
            help=(
                "vLLM's --max-logprobs (default 20): a request for more than N logprobs "
                "(completions' logprobs, chat's top_logprobs, prompt_logprobs) gets vLLM's "
                "400; 0 refuses every request for one or more, as vLLM does"
            ),
        ),
        Flag(
            "--without",
            type=_features,
            action="append",
            default=[],
            metavar="FEATURE[,FEATURE]",
            help=(
                "serve without a feature (repeatable, or a comma list): prompt_logprobs, "
                "token_ids (return_token_ids), stream_usage (stream_options), logprobs "
                "(logprobs, top_logprobs) are ignored in requests, as llama.cpp ignores "
                "prompt_logprobs and return_token_ids; chat answers 400 as vLLM does for a "
                "model without a chat template"
            ),
        ),
    ),
    "what the engine answers beyond text, for a reference without a feature or a "
    "candidate that lost one; without these flags, everything vLLM has",
)


def _xid(text: str) -> tuple[int, float]:
    """``"79:3"`` -> (79, 3.0): XID 79 three seconds after ready."""
    from simengine.gpu import parse_xid

    try:
        return parse_xid(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


GPUS = FlagGroup(
    "simulated GPUs",
    (
        Flag("--gpu-memory-gib", type=float, default=20.0, help="GPU memory the engine holds"),
        Flag("--gpu-idle-w", type=float, default=90.0, help="each GPU's draw with no work (W)"),
        Flag(
            "--gpu-j-per-token",
            type=float,
            default=0.5,
            help="energy per generated token beyond idle (J), spread over the GPUs",
        ),
        Flag(
            "--gpu-xid",
            type=_xid,
            action="append",
            default=[],
            metavar="CODE:AT_S",
            help="the driver reports XID CODE at AT_S seconds after ready (repeatable)",
        ),
        Flag(
            "--gpu-state-dir",
            metavar="DIR",
            help="write each CUDA_VISIBLE_DEVICES GPU's state here as INDEX.json (default: "
            "$SIMENGINE_GPU_STATE_DIR; neither: no state is written)",
        ),
    ),
    "what the engine's GPUs show to a stand-in nvidia-smi or DCGM exporter (simengine/gpu.py)",
)

GROUND_TRUTH = FlagGroup(
    "ground truth",
    (
        Flag(
            "--truth-log",
            metavar="FILE",
            help="write one JSON line per finished generation request: arrival and event times",
        ),
    ),
)

OTHER = FlagGroup(
    None, (Flag("--tag", default="", help="free text, ignored (find the process by it)"),)
)

GROUPS: tuple[FlagGroup, ...] = (
    NETWORK,
    CONNECTIONS,
    MODEL,
    PERFORMANCE,
    DISAGGREGATED,
    NUMERICS,
    FAULTS,
    FEATURE_FLAGS,
    GPUS,
    GROUND_TRUTH,
    OTHER,
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
