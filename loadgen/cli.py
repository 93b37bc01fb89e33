"""``loadgen``: drive one engine by hand with the same machinery the gate uses.

Exit status: 0 when the run completed and at least one request succeeded, 1 when every request
failed (usually a wrong URL or a dead server, which a script should notice), 2 on a bad
argument. The progress bar goes to stderr so that ``--json`` output on stdout stays clean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loadgen.client import RequestSpec, Target
from loadgen.metrics import Distribution, Summary, summarize
from loadgen.prompts import synthetic_prompts
from loadgen.records import RequestRecord, write_jsonl
from loadgen.runner import PairedResult, run_paired
from loadgen.schedule import ARRIVALS, build_offsets

DEFAULT_REQUESTS = 100


def _number(kind: Callable[[str], float], *, minimum: float, inclusive: bool) -> Any:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a valid number: {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


_positive_float = _number(float, minimum=0, inclusive=False)
_positive_int = _number(int, minimum=1, inclusive=True)
_non_negative_int = _number(int, minimum=0, inclusive=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadgen",
        description="Send a seeded synthetic load to an OpenAI-compatible engine and report "
        "TTFT, ITL, TPOT, end-to-end latency, dispatch delay and throughput.",
    )
    parser.add_argument("--url", required=True, help="engine base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api", choices=["completions", "chat"], default="completions")
    parser.add_argument("--model", default="demo-model")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=_positive_float, help="open loop: requests per second")
    mode.add_argument("--concurrency", type=_positive_int, help="closed loop: requests in flight")
    parser.add_argument("--arrival", choices=list(ARRIVALS), default="poisson")
    parser.add_argument(
        "--burstiness", type=_positive_float, default=1.0, help="gamma shape (1 = Poisson)"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--requests", type=_positive_int, help=f"number of requests (default {DEFAULT_REQUESTS})"
    )
    size.add_argument("--duration", type=_positive_float, help="open loop: seconds of schedule")
    parser.add_argument("--prompt-tokens", type=_positive_int, default=128)
    parser.add_argument("--max-tokens", type=_positive_int, default=128)
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask the engine for exactly --max-tokens"
    )
    parser.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds per read")
    parser.add_argument("--seed", type=_non_negative_int, default=0)
    parser.add_argument("--records", metavar="FILE", help="write every request record as JSONL")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on errors (naming the flag), 0 on --help
        return exc.code if isinstance(exc.code, int) else 2
    if args.concurrency is not None and args.duration is not None:
        parser.print_usage(sys.stderr)
        print("loadgen: error: argument --duration: needs --rate; closed loop (--concurrency) "
              "runs a fixed --requests", file=sys.stderr)  # fmt: skip
        return 2
    try:
        target = Target(
            name="target", base_url=args.url, api=args.api, model=args.model, timeout_s=args.timeout
        )
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"loadgen: error: argument --url: {exc}", file=sys.stderr)
        return 2

    offsets = None
    if args.rate is None:
        count = args.requests if args.requests is not None else DEFAULT_REQUESTS
    else:
        if args.duration is not None:
            size: dict[str, Any] = {"duration_s": args.duration}
        else:
            size = {"requests": args.requests if args.requests is not None else DEFAULT_REQUESTS}
        offsets = build_offsets(
            args.arrival, args.rate, burstiness=args.burstiness, seed=args.seed, **size
        )
        count = len(offsets)
    try:
        prompts = synthetic_prompts(count, args.prompt_tokens, seed=args.seed)
    except ValueError as exc:
        print(f"loadgen: error: argument --prompt-tokens: {exc}", file=sys.stderr)
        return 2
    extra: dict[str, Any] = {"ignore_eos": True} if args.ignore_eos else {}
    requests = [
        RequestSpec(request_id=i, prompt=p, max_tokens=args.max_tokens, extra=extra)
        for i, p in enumerate(prompts)
    ]

    err = Console(stderr=True)
    result = asyncio.run(_run(target, requests, offsets, args.concurrency, err))
    records = result.records[target.name]
    if args.records:
        write_jsonl(args.records, records)
    summary = summarize(records, result.duration_s)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        Console().print(_table(summary, target))
    return 0 if summary["requests"]["ok"] > 0 or not records else 1


async def _run(
    target: Target,
    requests: list[RequestSpec],
    offsets: Any,
    concurrency: int | None,
    err: Console,
) -> PairedResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Ctrl-C stops the run but still reports what finished.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[errors]} errors"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    task = progress.add_task(target.url, total=len(requests), errors=0)
    errors = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal errors
        errors += 0 if record.ok else 1
        progress.update(task, advance=1, errors=errors)

    try:
        with progress:
            return await run_paired(
                [target],
                requests,
                offsets_s=offsets,
                concurrency=concurrency,
                on_record=on_record,
                stop=stop,
            )
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(summary: Summary, target: Target) -> Table:
    req = summary["requests"]
    thr = summary["throughput"]
    table = Table(title=f"{target.url} ({target.model})")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    rows: list[tuple[str, Distribution]] = [
        ("TTFT ms", summary["ttft_ms"]),
        ("ITL ms", summary["itl_ms"]),
        ("TPOT ms", summary["tpot_ms"]),
        ("E2E ms", summary["e2e_ms"]),
        ("dispatch delay ms", summary["dispatch_delay_ms"]),
    ]
    for name, dist in rows:
        table.add_row(
            name, _fmt(dist["mean"]), _fmt(dist["p50"]), _fmt(dist["p90"]), _fmt(dist["p99"])
        )
    errors = ", ".join(f"{k}={v}" for k, v in summary["errors_by_kind"].items() if v) or "none"
    table.caption = (
        f"{req['ok']}/{req['sent']} ok, errors: {errors}; "
        f"{summary['output_tokens']} output tokens in {summary['duration_s']:.2f} s; "
        f"{_fmt(thr['requests_per_s'])} req/s, {_fmt(thr['output_tokens_per_s'])} tok/s"
    )
    return table
