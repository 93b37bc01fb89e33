"""``loadgen``: drive one engine by hand with the same machinery the gate uses.

Exit status: 0 when the run completed and at least one request succeeded (for
``--scenario compatibility``: every probe answered well), 1 when every request failed
(usually a wrong URL or a dead server, which a script should notice), 2 on a bad argument.
The progress bar goes to stderr so that ``--json`` output on stdout stays clean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loadgen import suite
from loadgen.client import RequestSpec, Target, make_client
from loadgen.datasets import conversation_requests, load_sharegpt, load_trace
from loadgen.metrics import Distribution, check_slos, summarize
from loadgen.prompts import (
    LengthDist,
    sample_lengths,
    shared_prefix_prompts,
    synthetic_conversations,
    synthetic_prompts,
    varied_prompts,
    word_lists,
)
from loadgen.records import RequestRecord, write_jsonl
from loadgen.runner import PairedResult, run_paired
from loadgen.schedule import ARRIVALS, PhasedSchedule, build_offsets
from loadgen.tokens import TokenCounter, fit_prompts
from loadgen.workers import run_sharded

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


def _length_dist(text: str) -> LengthDist:
    try:
        return LengthDist.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    mode = parser.add_mutually_exclusive_group()
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
    parser.add_argument("--max-tokens", type=_positive_int, default=None, help="default 128")
    parser.add_argument(
        "--prompt-dist",
        type=_length_dist,
        metavar="KIND:MEAN[:SPREAD]",
        help="prompt lengths from fixed|uniform|normal|lognormal (instead of --prompt-tokens)",
    )
    parser.add_argument(
        "--output-dist", type=_length_dist, metavar="KIND:MEAN[:SPREAD]", help="max_tokens lengths"
    )
    parser.add_argument(
        "--tokenizer",
        choices=["auto", "engine", "estimate"],
        default="auto",
        help="count prompt lengths with the engine's /tokenize (auto: when it has one)",
    )
    parser.add_argument(
        "--shared-prefix",
        metavar="GROUPS:TOKENS",
        help="prompts in GROUPS families sharing a TOKENS-long prefix",
    )
    parser.add_argument(
        "--turns", type=_positive_int, default=1, help="chat turns per conversation (multi-turn)"
    )
    parser.add_argument("--dataset", metavar="FILE", help="ShareGPT-style JSONL conversations")
    parser.add_argument("--trace", metavar="FILE", help="replay a JSONL trace (its own schedule)")
    parser.add_argument("--speedup", type=_positive_float, default=1.0, help="trace time divisor")
    parser.add_argument(
        "--scenario", choices=list(suite.SUITE), help="a built-in scenario; flags override it"
    )
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=MS",
        help="goodput SLO, repeatable: ttft_ms=200 tpot_ms=50 e2e_ms=...",
    )
    parser.add_argument("--workers", type=_positive_int, default=1, help="client processes")
    parser.add_argument(
        "--warmup", type=_non_negative_int, default=0, help="warm-up requests, not recorded"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask the engine for exactly --max-tokens"
    )
    parser.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds per read")
    parser.add_argument("--seed", type=_non_negative_int, default=0)
    parser.add_argument("--records", metavar="FILE", help="write every request record as JSONL")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


@dataclass
class _Plan:
    """Everything a run needs, built from the flags before any request is sent."""

    requests: list[RequestSpec]
    offsets: npt.NDArray[np.float64] | None
    concurrency: int | None
    phases: PhasedSchedule | None = None
    token_source: str = "words"
    warmup: list[RequestSpec] = field(default_factory=list)


class _BadFlag(Exception):
    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on errors (naming the flag), 0 on --help
        return exc.code if isinstance(exc.code, int) else 2

    def bad(flag: str, message: str) -> int:
        parser.print_usage(sys.stderr)
        print(f"loadgen: error: argument {flag}: {message}", file=sys.stderr)
        return 2

    schedule_given = args.scenario is not None or args.trace is not None
    if args.rate is None and args.concurrency is None and not schedule_given:
        return bad("--rate/--concurrency", "one of the arguments --rate --concurrency is required")
    if args.concurrency is not None and args.duration is not None:
        return bad(
            "--duration", "needs --rate; closed loop (--concurrency) runs a fixed --requests"
        )
    try:
        target = Target(
            name="target", base_url=args.url, api=args.api, model=args.model, timeout_s=args.timeout
        )
    except ValueError as exc:
        return bad("--url", str(exc))
    try:
        slos = check_slos(dict(_slo(text) for text in args.slo)) if args.slo else None
    except ValueError as exc:
        return bad("--slo", str(exc))
    if args.scenario in ("compatibility", "correctness"):
        return _probe_command(args, target)
    try:
        plan = _plan(args)
        if args.tokenizer != "estimate" and _fits(args):
            plan = asyncio.run(_fit(plan, args, target))
    except _BadFlag as exc:
        return bad(exc.flag, str(exc))
    if args.concurrency is not None and args.workers > args.concurrency:
        return bad("--workers", f"{args.workers} workers need --concurrency >= {args.workers}")

    err = Console(stderr=True)
    if args.workers > 1:
        result = _run_workers(target, plan, args.workers, err)
    else:
        result = asyncio.run(_run(target, plan, err))
    records = result.records[target.name]
    if args.records:
        write_jsonl(args.records, records)
    summary: dict[str, Any] = dict(summarize(records, result.duration_s, slos=slos))
    if plan.phases is not None:
        summary["phases"] = _by_phase(records, plan.phases, slos)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        Console().print(_table(summary, target, plan))
    return 0 if summary["requests"]["ok"] > 0 or not records else 1


def _slo(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise ValueError(f"expected METRIC=MS, got {text!r}") from None


def _fits(args: argparse.Namespace) -> bool:
    """Whether prompts are ours to size (not a trace's or a dataset's own text)."""
    return args.trace is None and args.dataset is None


def _plan(args: argparse.Namespace) -> _Plan:
    extra: dict[str, Any] = {"ignore_eos": True} if args.ignore_eos else {}
    if args.trace is not None:
        if args.rate is not None or args.concurrency is not None:
            raise _BadFlag("--trace", "a trace brings its own schedule; drop --rate/--concurrency")
        try:
            trace = load_trace(args.trace, speedup=args.speedup, limit=args.requests, extra=extra)
        except (OSError, ValueError) as exc:
            raise _BadFlag("--trace", str(exc)) from None
        return _Plan(trace.requests, trace.offsets_s, None, token_source="trace")

    offsets, phases, count = _schedule(args)
    max_tokens = args.max_tokens if args.max_tokens is not None else 128
    if args.output_dist is not None:
        outs = sample_lengths(count, args.output_dist, seed=args.seed + 1)
    else:
        outs = [max_tokens] * count
    if args.dataset is not None:
        try:
            conversations = load_sharegpt(args.dataset)
        except (OSError, ValueError) as exc:
            raise _BadFlag("--dataset", str(exc)) from None
        if not conversations:
            raise _BadFlag("--dataset", "no conversations in the file")
        pool = (conversations * (count // len(conversations) + 1))[:count]
        requests = conversation_requests(
            pool, max_tokens=args.max_tokens, multi_turn=args.turns > 1, extra=extra
        )
        requests = requests[:count]
    elif args.turns > 1:
        if args.api != "chat":
            raise _BadFlag("--turns", "multi-turn conversations need --api chat")
        lengths = args.prompt_dist or LengthDist("fixed", args.prompt_tokens)
        convs = synthetic_conversations(
            math.ceil(count / args.turns), turns=args.turns, lengths=lengths, seed=args.seed
        )
        requests = [
            dataclasses.replace(r, max_tokens=outs[r.request_id])
            for r in conversation_requests(convs, max_tokens=max_tokens, extra=extra)[:count]
        ]
    else:
        try:
            prompts = _prompts(args, count)
        except ValueError as exc:
            raise _BadFlag("--prompt-tokens", str(exc)) from None
        requests = [RequestSpec(i, p, outs[i], extra) for i, p in enumerate(prompts)]
    warmup = [
        RequestSpec(-1 - i, p, 2, extra)
        for i, p in enumerate(synthetic_prompts(args.warmup, 8, seed=args.seed + 999))
    ]
    return _Plan(requests, offsets, args.concurrency, phases, "words", warmup)


def _schedule(
    args: argparse.Namespace,
) -> tuple[npt.NDArray[np.float64] | None, PhasedSchedule | None, int]:
    """The send offsets (None: closed loop), the phases of a scenario, and the request count."""
    phases: PhasedSchedule | None = None
    if args.scenario is not None:
        overrides: dict[str, Any] = {}
        for flag, knob in (
            ("rate", "rate"),
            ("requests", "requests"),
            ("duration", "duration_s"),
            ("burstiness", "burstiness"),
        ):
            if getattr(args, flag) is not None and getattr(args, flag) != _DEFAULTS.get(flag):
                overrides[knob] = getattr(args, flag)
        if args.arrival != "poisson":
            overrides["arrival"] = args.arrival
        if args.concurrency is not None:
            raise _BadFlag("--concurrency", f"scenario {args.scenario} is an open-loop schedule")
        try:
            built = suite.get(args.scenario).build(args.seed, **overrides)
        except ValueError as exc:
            raise _BadFlag("--scenario", str(exc)) from None
        offsets, phases = built.offsets_s, built.phases
        count = len(built.requests)
    elif args.rate is None:
        offsets = None
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
    return offsets, phases, count


_DEFAULTS = {"burstiness": 1.0}


def _prompts(args: argparse.Namespace, count: int) -> list[str]:
    if args.shared_prefix is not None:
        try:
            groups, prefix = (int(x) for x in args.shared_prefix.split(":"))
        except ValueError:
            raise ValueError(
                f"--shared-prefix: expected GROUPS:TOKENS, got {args.shared_prefix!r}"
            ) from None
        suffix = args.prompt_dist or LengthDist("fixed", args.prompt_tokens)
        return shared_prefix_prompts(
            count, groups=groups, prefix_tokens=prefix, suffix=suffix, seed=args.seed
        )
    if args.prompt_dist is not None:
        return varied_prompts(count, args.prompt_dist, seed=args.seed)
    return synthetic_prompts(count, args.prompt_tokens, seed=args.seed)


async def _fit(plan: _Plan, args: argparse.Namespace, target: Target) -> _Plan:
    """Refit synthetic prompts to the engine's own token counts, when it can count them.

    Only single prompts of our own words are refitted; a prompt that already has the right
    count (always, on the sim) is left exactly as generated.
    """
    async with make_client(target, 2, lean=False) as client:
        counter = await TokenCounter.connect(target, client)
        if counter.source != "engine":
            if args.tokenizer == "engine":
                raise _BadFlag("--tokenizer", f"{target.base_url} has no usable /tokenize")
            return dataclasses.replace(plan, token_source="estimate")
        if args.shared_prefix is not None or args.turns > 1:
            return dataclasses.replace(plan, token_source="engine (not refitted)")
        if args.prompt_dist is not None:
            lengths = sample_lengths(len(plan.requests), args.prompt_dist, seed=args.seed)
        else:
            lengths = [args.prompt_tokens] * len(plan.requests)
        extra_words = word_lists(lengths, seed=args.seed)
        words = [r.prompt.split() + extra_words[i] for i, r in enumerate(plan.requests)]
        prompts, _ = await fit_prompts(words, lengths, counter)
    requests = [
        dataclasses.replace(r, prompt=p) for r, p in zip(plan.requests, prompts, strict=True)
    ]
    return dataclasses.replace(plan, requests=requests, token_source="engine")


def _by_phase(
    records: Sequence[RequestRecord], phases: PhasedSchedule, slos: dict[str, float] | None
) -> dict[str, Any]:
    index = phases.phase_index
    out: dict[str, Any] = {}
    for k, phase in enumerate(phases.phases):
        mine = [r for r in records if 0 <= r.request_id < len(index) and index[r.request_id] == k]
        out[phase.name] = dict(summarize(mine, phase.duration_s, slos=slos))
    return out


def _probe_command(args: argparse.Namespace, target: Target) -> int:
    if args.scenario == "compatibility":
        results = asyncio.run(suite.run_probes(target))
        if args.json:
            print(json.dumps([dataclasses.asdict(r) | {"ok": r.ok} for r in results], indent=2))
        else:
            table = Table(title=f"compatibility probes: {target.base_url}")
            for col in ("probe", "api", "stream", "status", "ok", "problems"):
                table.add_column(col)
            for r in results:
                table.add_row(
                    r.name, r.api, str(r.stream), str(r.status), "yes" if r.ok else "NO",
                    "; ".join(r.problems)[:80],
                )  # fmt: skip
            Console().print(table)
        return 0 if all(r.ok for r in results) else 1
    checks = asyncio.run(suite.run_correctness(target, seed=args.seed))
    print(json.dumps([dataclasses.asdict(c) for c in checks], indent=None if args.json else 2))
    return 0 if all(c.error is None for c in checks) else 1


def _progress(err: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[errors]} errors"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def _run_workers(target: Target, plan: _Plan, workers: int, err: Console) -> PairedResult:
    progress = _progress(err)
    task = progress.add_task(f"{target.url} x{workers}", total=len(plan.requests), errors=0)
    interrupted = False

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True  # Ctrl-C stops the workers but still reports what finished

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with progress:
            return run_sharded(
                [target],
                plan.requests,
                workers=workers,
                offsets_s=plan.offsets,
                concurrency=plan.concurrency,
                warmup=plan.warmup,
                on_progress=lambda done, errors: progress.update(
                    task, completed=done, errors=errors
                ),
                should_stop=lambda: interrupted,
            )
    finally:
        signal.signal(signal.SIGINT, previous)


async def _run(target: Target, plan: _Plan, err: Console) -> PairedResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Ctrl-C stops the run but still reports what finished.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    progress = _progress(err)
    task = progress.add_task(target.url, total=len(plan.requests), errors=0)
    errors = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal errors
        errors += 0 if record.ok else 1
        progress.update(task, advance=1, errors=errors)

    try:
        with progress:
            return await run_paired(
                [target],
                plan.requests,
                offsets_s=plan.offsets,
                concurrency=plan.concurrency,
                on_record=on_record,
                stop=stop,
                warmup=plan.warmup,
            )
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(summary: dict[str, Any], target: Target, plan: _Plan) -> Table:
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
    resent = f", sent again on a fresh connection: {req['resent']}" if req["resent"] else ""
    table.caption = (
        f"{req['ok']}/{req['sent']} ok, errors: {errors}{resent}; "
        f"{summary['output_tokens']} output tokens in {summary['duration_s']:.2f} s; "
        f"{_fmt(thr['requests_per_s'])} req/s, {_fmt(thr['output_tokens_per_s'])} tok/s; "
        f"prompt lengths: {plan.token_source}"
    )
    good = summary.get("goodput")
    if good is not None:
        table.caption += f"; goodput {_fmt(good['requests_per_s'])} req/s ({good['requests']} ok)"
    phases = summary.get("phases")
    if phases:
        for name, part in phases.items():
            ttft = part["ttft_ms"]
            table.add_row(
                f"{name}: TTFT ms", _fmt(ttft["mean"]), _fmt(ttft["p50"]),
                _fmt(ttft["p90"]), _fmt(ttft["p99"]),
            )  # fmt: skip
    return table
