"""Command-line configuration of the sim engine.

Every knob is a flag so that a test or a gate run can build a reference and a candidate that
differ in exactly one respect (a slower ITL, a fault, another model seed) and nothing else.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything that determines how one sim process behaves.

    Frozen so the server, the engine and the timing model can share one instance without
    any of them changing what the others see.
    """

    port: int
    host: str = "127.0.0.1"
    model: str = "demo-model"
    max_model_len: int = 4096
    vocab_size: int = 4096
    # Startup phases: the port stays closed while "loading", then /health answers 503.
    load_s: float = 0.3
    warmup_s: float = 0.2
    # `seed` drives timing jitter and fault draws; `model_seed` drives the toy weights, so
    # two engines can jitter differently yet decode greedily to identical text.
    seed: int = 0
    model_seed: int = 0
    # Timing model.
    ttft_ms: float = 40.0
    prefill_us_per_token: float = 50.0
    itl_ms: float = 12.0
    itl_per_running_ms: float = 0.05
    jitter: float = 0.03
    tokens_per_event: int = 1
    max_num_seqs: int = 256
    # Faults.
    crash_after_requests: int | None = None
    error_rate: float = 0.0
    tag: str = ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gate.engines.sim",
        description=(
            "OpenAI-compatible streaming server that imitates vLLM with a toy model and a "
            "configurable timing model."
        ),
    )
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    net.add_argument(
        "--port",
        type=int,
        required=True,
        help="port to bind; 0 picks a free port, announced on stdout",
    )

    mdl = parser.add_argument_group("model")
    mdl.add_argument("--model", default="demo-model", help="served model id")
    mdl.add_argument("--max-model-len", type=int, default=4096, help="context window in tokens")
    mdl.add_argument("--vocab-size", type=int, default=4096, help="toy vocabulary size")
    mdl.add_argument(
        "--model-seed",
        type=int,
        default=0,
        help="seed of the toy weights; equal seeds give identical greedy outputs",
    )

    phases = parser.add_argument_group("startup")
    phases.add_argument("--load-s", type=float, default=0.3, help="seconds before the port opens")
    phases.add_argument(
        "--warmup-s",
        type=float,
        default=0.2,
        help="seconds /health answers 503 after the port opens",
    )

    timing = parser.add_argument_group("timing")
    timing.add_argument("--seed", type=int, default=0, help="seed of jitter and fault draws")
    timing.add_argument("--ttft-ms", type=float, default=40.0, help="base time to first token")
    timing.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=50.0,
        help="extra time to first token per prompt token, in microseconds",
    )
    timing.add_argument("--itl-ms", type=float, default=12.0, help="gap between stream events")
    timing.add_argument(
        "--itl-per-running-ms",
        type=float,
        default=0.05,
        help="extra gap per other running request (a light batching effect)",
    )
    timing.add_argument(
        "--jitter", type=float, default=0.03, help="sigma of the lognormal delay multiplier"
    )
    timing.add_argument(
        "--tokens-per-event", type=int, default=1, help="tokens carried by each stream event"
    )
    timing.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="requests generated at once; later ones wait (vllm:num_requests_waiting)",
    )

    faults = parser.add_argument_group("faults")
    faults.add_argument(
        "--crash-after-requests",
        type=int,
        default=None,
        metavar="N",
        help="exit with code 1 when generation request N+1 starts streaming",
    )
    faults.add_argument(
        "--error-rate",
        type=float,
        default=0.0,
        help="fraction of generation requests answered with HTTP 500",
    )
    parser.add_argument("--tag", default="", help="free text, ignored (find the process by it)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse and range-check flags, failing the way argparse does (exit code 2)."""
    parser = build_parser()
    ns = parser.parse_args(argv)

    def require(ok: bool, message: str) -> None:
        if not ok:
            parser.error(message)

    for name in (
        "load_s",
        "warmup_s",
        "ttft_ms",
        "prefill_us_per_token",
        "itl_ms",
        "itl_per_running_ms",
        "jitter",
    ):
        value = getattr(ns, name)
        require(
            math.isfinite(value) and value >= 0,
            f"--{name.replace('_', '-')} must be a finite number >= 0",
        )
    require(0 <= ns.port <= 65535, "--port must be in [0, 65535]")
    require(ns.max_model_len >= 1, "--max-model-len must be >= 1")
    require(16 <= ns.vocab_size <= 1 << 18, "--vocab-size must be in [16, 262144]")
    require(ns.tokens_per_event >= 1, "--tokens-per-event must be >= 1")
    require(ns.max_num_seqs >= 1, "--max-num-seqs must be >= 1")
    require(0.0 <= ns.error_rate <= 1.0, "--error-rate must be in [0, 1]")
    require(
        ns.crash_after_requests is None or ns.crash_after_requests >= 0,
        "--crash-after-requests must be >= 0",
    )
    require(bool(ns.model), "--model must not be empty")

    return SimConfig(
        port=ns.port,
        host=ns.host,
        model=ns.model,
        max_model_len=ns.max_model_len,
        vocab_size=ns.vocab_size,
        load_s=ns.load_s,
        warmup_s=ns.warmup_s,
        seed=ns.seed,
        model_seed=ns.model_seed,
        ttft_ms=ns.ttft_ms,
        prefill_us_per_token=ns.prefill_us_per_token,
        itl_ms=ns.itl_ms,
        itl_per_running_ms=ns.itl_per_running_ms,
        jitter=ns.jitter,
        tokens_per_event=ns.tokens_per_event,
        max_num_seqs=ns.max_num_seqs,
        crash_after_requests=ns.crash_after_requests,
        error_rate=ns.error_rate,
        tag=ns.tag,
    )
