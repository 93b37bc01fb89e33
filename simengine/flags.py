"""The sim's flags as data: every flag's name, type, default and help, in the titled groups
its ``--help`` shows (`Flag`, `FlagGroup`, `GROUPS`), with the argument types argparse calls.

One table serves the parser, its help and a reader looking for a knob; `simengine.cli` builds
the parser from it and checks what argparse cannot. The flags are a public interface (specs,
tests and docs name them): a flag is added here, never renamed.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simengine.config import ROLES
from simengine.features import DEFAULT_MAX_LOGPROBS, Feature, parse_features
from simengine.profiles import PROFILES

# -- argument types: argparse calls them, a bad value is argparse's usage error -----------------


def _comma_parts(text: str) -> list[str]:
    """The items of a comma list, stripped; empty items (``"3,,5"``, a trailing comma) skipped."""
    return [part for part in (p.strip() for p in text.split(",")) if part]


def _request_list(text: str) -> tuple[int, ...]:
    """``"3,5-7"`` -> (3, 5, 6, 7): generation request numbers, counted from 1."""
    out: list[int] = []
    for part in _comma_parts(text):
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
    for part in _comma_parts(text):
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
