"""How fast and how exact is loadgen's client, beside guidellm's, against the sim engine.

Run: ``.venv/bin/python bench/loadgen_bench.py [--quick] [--guidellm PATH] [--json]``.
``--quick`` is a smoke test (under two minutes); ``--guidellm`` names guidellm's virtual
environment (default ``/tmp/guidellm-venv``, see ``guidellm_peer``); without guidellm there,
only loadgen is measured.

Everything runs on this host: the sim engine (``python -m simengine``, started as a
process; nothing from ``gate`` is imported) with short TTFT/ITL, one token per event and its
``--truth-log``, which records for every request when it arrived and when each event was
emitted, on the monotonic clock. Both clients are run as commands against that same sim, one
after the other, at the same offered rates, 64-token streams with 16-token prompts. Measured:

- maximum sustained rate (loadgen only): the highest offered rate at which every request
  succeeds, the p99 dispatch delay stays under 10 ms and the achieved token throughput keeps
  within 20% of the offered one; for one loadgen process and for ``--workers 2``. On a
  two-core machine the sim shares the CPU, so this is a system figure; the client's own CPU
  per request is the figure that compares clients;
- measurement error against the truth log at 25/50/75% of that maximum, for both clients:
  per request ``|client TTFT - (first event emitted - arrival)|``; ITL per token,
  ``|client gap - emitted gap|`` with events paired by position (loadgen only: guidellm keeps
  no per-token times); and ITL as a per-request mean, ``|client (last - first token) /
  (tokens - 1) - the same from the truth log|``, the one ITL figure both clients allow;
  p50 and p99. loadgen's records join the truth log on its ``X-Request-Id``; guidellm sends
  no id of its own, so its requests are matched by time (``guidellm_peer.match_by_time``:
  guidellm's ``time.time()`` stamps, moved to the monotonic clock with an offset taken around
  the run; the causal one-to-one pairing with the least squared token delivery delays); the
  notes give how well that went, and flag it ambiguous when send-to-arrival lag exceeds the
  spacing of requests;
- schedule adherence: p99 dispatch delay (actual send minus intended send; guidellm:
  ``request_start - targeted_start``) at the same loads;
- client CPU per request and per streamed event (content chunks + usage chunk + ``[DONE]``),
  from the kernel's accounting of the client's whole process tree
  (``getrusage(RUSAGE_CHILDREN)`` around the command; loadgen's workers and guidellm's worker
  processes included), net of start-up. Start-up is the CPU of the same command run with a
  single request (median of several runs): neither command can start without sending one
  (``loadgen --requests`` must be >= 1; guidellm's ``max_requests`` must be positive, and a
  guidellm stopped at its backend check would skip its worker processes' start), so the net
  CPU is that of the other ``N - 1`` requests and is divided by ``N - 1``. Where the net CPU
  is under twice the spread of the start-up runs, the CPU figures are printed as n/a. CPU is
  given at each load and at a fixed-rate "cpu step" (``--cpu-rate``, default 50/s,
  ``--cpu-requests``, default 1500, both clients), long enough for guidellm's net CPU to stand
  well above its ~23 s start-up's run-to-run spread; the ratio printed is guidellm's CPU per
  request over loadgen's. Both clients get the same four warm-up requests: loadgen's
  ``--warmup 4`` (sent before the schedule, not recorded) and, for guidellm, four extra
  requests at the head of its schedule left out of its figures; the one-request start-up runs
  carry the same four.

Figures from a busy machine are disturbed (other processes share the two cores); CPU
accounting is per process, but start-up CPU varies by a few percent between runs, which the
net figures inherit, and guidellm's CPU for the same load varies far more than its start-up
on a contended machine (its 10 worker processes share the two cores with everything else;
why its CPU varies so was not established; idle seconds cost it no CPU; the wall column shows
how long each command took). Rerun on a quiet machine for reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guidellm_peer

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MAX_TOKENS = 64
PROMPT_TOKENS = 16
WARMUP = 4
SIM_FLAGS = ["--load-s", "0", "--warmup-s", "0", "--ttft-ms", "5", "--itl-ms", "2"]
SIM_FLAGS += ["--jitter", "0", "--tokens-per-event", "1", "--prefill-us-per-token", "0"]
NO_PER_TOKEN = "guidellm keeps only the first and last token times of a request"
NOT_SEARCHED = (
    "guidellm's maximum rate is not searched: every guidellm run costs ~15-20 s of start-up "
    "(10 worker processes importing torch/transformers); see its rows at our loads"
)


@dataclass
class Run:
    client: str
    rate: float
    workers: int = 1
    requests: int = 0  # measured requests (warm-ups excluded)
    ok: int = 0
    cpu_s: float = 0.0  # the whole process tree, start-up included
    startup_cpu_s: float | None = None  # the same command with one request (median)
    events: int = 0  # streamed events of the measured requests
    wall_s: float = 0.0
    achieved_tokens_per_s: float = 0.0
    dispatch_p99_ms: float | None = None
    ttft_err_ms: dict[str, float | None] = field(default_factory=dict)
    itl_err_ms: dict[str, float | None] = field(default_factory=dict)
    itl_mean_err_ms: dict[str, float | None] = field(default_factory=dict)
    matched: str = ""
    na: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def net_cpu_s(self) -> float | None:
        if self.startup_cpu_s is None:
            return None
        return self.cpu_s - self.startup_cpu_s

    @property
    def cpu_per_request_ms(self) -> float | None:
        """Net of start-up; the start-up run carried one request, hence ``N - 1``."""
        net = self.net_cpu_s
        if net is None or self.requests < 2 or not self.ok:
            return None
        return 1e3 * net / (self.requests - 1)

    @property
    def cpu_per_event_us(self) -> float | None:
        per_request = self.cpu_per_request_ms
        if per_request is None or not self.events:
            return None
        return 1e3 * per_request / (self.events / self.requests)

    @property
    def kept_up(self) -> bool:
        """Every request ok, dispatch on time, and tokens streamed at 80% of the offered rate
        (the run's duration includes the last stream's tail, hence the slack)."""
        offered = self.rate * MAX_TOKENS
        return (
            self.requests > 0
            and self.ok == self.requests
            and self.dispatch_p99_ms is not None
            and self.dispatch_p99_ms <= 10.0
            and self.achieved_tokens_per_s >= 0.8 * offered
        )


# --------------------------------------------------------------------------- processes


@contextlib.contextmanager
def sim(truth_log: Path | None) -> Iterator[str]:
    flags = [*SIM_FLAGS, *(["--truth-log", str(truth_log)] if truth_log else [])]
    proc = subprocess.Popen(
        [PYTHON, "-m", "simengine", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        if url is None:
            raise RuntimeError("the sim did not start")
        time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def sim_has_truth_log() -> bool:
    out = subprocess.run(
        [PYTHON, "-m", "simengine", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    return "--truth-log" in out.stdout


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a command; its process tree's CPU seconds (children it reaped included) and wall."""
    before = children_cpu()
    start = time.monotonic()
    out = subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False
    )
    return out, children_cpu() - before, time.monotonic() - start


# --------------------------------------------------------------------------- truth


def read_truth(truth: Path, since_ns: int, until_ns: int | None = None) -> list[dict[str, Any]]:
    """Truth lines of requests that arrived in the window (waits for the sim's flush)."""
    time.sleep(0.4)  # the sim flushes its truth log every 0.25 s
    rows = []
    for line in truth.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            arrival = row.get("arrival_ns", 0)
            if arrival >= since_ns and (until_ns is None or arrival <= until_ns):
                rows.append(row)
    return rows


@dataclass(frozen=True)
class Seen:
    """One request as a client measured it (durations in ns; absolute clocks differ)."""

    ttft_ns: float
    span_ns: float | None = None  # first content token to last
    tokens: int = 0  # content tokens
    first_tokens: int = 1  # tokens in the first content event
    chunk_ns: Sequence[int] | None = None  # per content event, when the client keeps them


@dataclass
class Errors:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    itl_mean: list[float] = field(default_factory=list)


def errors(pairs: Sequence[tuple[Seen, dict[str, Any]]]) -> Errors:
    """|measured - true| in ms: TTFT, ITL per token (events paired by position, an event of k
    tokens counting as k gaps of g/k) and ITL as a per-request mean."""
    out = Errors()
    for seen, row in pairs:
        events = [e for e in row["events"] if e[1] > 0]
        if not events:
            continue
        true_ttft = events[0][0] - row["arrival_ns"]
        out.ttft.append(abs(seen.ttft_ns - true_ttft) / 1e6)
        steps = seen.tokens - seen.first_tokens  # tokens after the first event
        true_steps = sum(e[1] for e in events) - events[0][1]
        if seen.span_ns is not None and steps > 0 and true_steps > 0:
            true_mean = (events[-1][0] - events[0][0]) / true_steps
            out.itl_mean.append(abs(seen.span_ns / steps - true_mean) / 1e6)
        ts = seen.chunk_ns
        if ts is not None and len(ts) == len(events):
            for j in range(1, len(ts)):
                k = max(1, events[j][1])
                gap_c = (ts[j] - ts[j - 1]) / k
                gap_t = (events[j][0] - events[j - 1][0]) / k
                out.itl.extend([abs(gap_c - gap_t) / 1e6] * k)
    return out


def pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(values, [50, 99]).tolist()
    return {"p50": p50, "p99": p99}


def set_errors(run: Run, errs: Errors) -> None:
    run.ttft_err_ms, run.itl_err_ms = pct(errs.ttft), pct(errs.itl)
    run.itl_mean_err_ms = pct(errs.itl_mean)


# --------------------------------------------------------------------------- loadgen


def run_loadgen(url: str, rate: float, n: int, workers: int, records: Path) -> Run:
    argv = [PYTHON, "-m", "loadgen", "--url", url, "--rate", f"{rate:g}", "--requests", str(n)]
    argv += ["--max-tokens", str(MAX_TOKENS), "--prompt-tokens", str(PROMPT_TOKENS)]
    argv += ["--ignore-eos", "--json", "--records", str(records), "--tokenizer", "estimate"]
    argv += ["--workers", str(workers), "--warmup", str(WARMUP), "--seed", str(int(rate))]
    out, cpu, wall = timed(argv, cwd=ROOT)
    run = Run("loadgen", rate, workers, requests=n, cpu_s=cpu, wall_s=wall)
    if out.returncode not in (0, 1):
        run.note = f"exit {out.returncode}: {out.stderr[-300:]}"
        return run
    summary = json.loads(out.stdout)
    run.ok = summary["requests"]["ok"]
    run.dispatch_p99_ms = summary["dispatch_delay_ms"]["p99"]
    run.achieved_tokens_per_s = summary["throughput"]["output_tokens_per_s"] or 0.0
    recs = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    run.events = sum(len(r["chunk_ns"]) + 2 for r in recs)  # + the usage chunk and [DONE]
    return run


def loadgen_errors(records: Path, rows: list[dict[str, Any]]) -> tuple[Errors, str]:
    """Records joined to truth lines by request id (loadgen's ``X-Request-Id``)."""
    by_id = {str(r["request_id"]): r for r in rows if r.get("request_id") is not None}
    pairs: list[tuple[Seen, dict[str, Any]]] = []
    total = 0
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        total += 1
        row = by_id.get(str(rec["request_id"]))
        if row is None or rec["first_token_ns"] is None or rec["error_kind"] is not None:
            continue
        ts, ks = rec["chunk_ns"], rec["chunk_tokens"]
        seen = Seen(
            ttft_ns=rec["first_token_ns"] - rec["sent_ns"],
            span_ns=ts[-1] - ts[0] if ts else None,
            tokens=sum(ks),
            first_tokens=ks[0] if ks else 1,
            chunk_ns=ts,
        )
        pairs.append((seen, row))
    return errors(pairs), f"{len(pairs)}/{total} by X-Request-Id"


# --------------------------------------------------------------------------- guidellm


@dataclass
class Guidellm:
    install: guidellm_peer.Install
    tokenizer: Path
    work: Path


def wall_minus_mono_ns() -> int:
    return time.time_ns() - time.monotonic_ns()


def run_guidellm(
    g: Guidellm, url: str, rate: float, n: int, truth: Path | None, *, startup: bool = False
) -> Run:
    """``guidellm run`` at a constant rate: ``n`` measured requests after ``WARMUP`` more;
    with ``startup`` only its CPU is of interest."""
    run = Run("guidellm", rate, workers=1, requests=n)
    report = g.work / "guidellm.json"
    report.unlink(missing_ok=True)
    argv = guidellm_peer.command(
        g.install,
        url,
        rate=rate,
        requests=n + WARMUP,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=MAX_TOKENS,
        tokenizer=g.tokenizer,
        output=report,
    )
    env = dict(os.environ, **guidellm_peer.OFFLINE_ENV)
    offset_before = wall_minus_mono_ns()
    since = time.monotonic_ns()
    try:
        out, run.cpu_s, run.wall_s = timed(argv, cwd=g.work, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        run.note = f"could not run guidellm: {exc}"
        return run
    until = time.monotonic_ns()
    offset = (offset_before + wall_minus_mono_ns()) // 2
    drift_ms = abs(wall_minus_mono_ns() - offset_before) / 1e6
    if out.returncode != 0 or not report.exists():
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        run.note = f"guidellm exited {out.returncode}: {' | '.join(tail)[:400]}"
        return run
    if startup:
        return run
    requests = guidellm_peer.load_report(report)
    measured = requests[WARMUP:]
    done = [r for r in measured if r.status == "successful"]
    run.ok = len(done)
    run.events = sum(r.iterations for r in measured)
    delays = [
        1e3 * (r.start_s - r.targeted_s)
        for r in measured
        if r.start_s is not None and r.targeted_s is not None
    ]
    run.dispatch_p99_ms = pct(delays)["p99"]
    ends = [r.end_s for r in done if r.end_s is not None]
    starts = [r.start_s for r in measured if r.start_s is not None]
    if ends and starts and max(ends) > min(starts):
        tokens = sum(r.output_tokens for r in done)
        run.achieved_tokens_per_s = tokens / (max(ends) - min(starts))
    run.na["itl_err_ms"] = NO_PER_TOKEN
    if truth is None:
        run.note = "the sim has no --truth-log: error not measured"
        return run
    rows = []
    for row in read_truth(truth, since, until):
        events = [e for e in row["events"] if e[1] > 0]
        if row.get("status") == 200 and events:
            rows.append((row, events[0][0], events[-1][0]))
    offset_ms = offset / 1e6
    warm = {id(r) for r in requests[:WARMUP]}
    streamed = [  # warm-ups included: they are in the truth log too
        r
        for r in requests
        if r.status == "successful" and None not in (r.start_s, r.first_token_s, r.last_token_s)
    ]
    client_ms = [
        (1e3 * (r.start_s or 0) - offset_ms, 1e3 * (r.first_token_s or 0) - offset_ms,
         1e3 * (r.last_token_s or 0) - offset_ms)
        for r in streamed
    ]  # fmt: skip
    truth_ms = [(row["arrival_ns"] / 1e6, first / 1e6, last / 1e6) for row, first, last in rows]
    matched = guidellm_peer.match_by_time(client_ms, truth_ms)
    pairs: list[tuple[Seen, dict[str, Any]]] = []
    lags = []
    for i, j in matched:
        req, row = streamed[i], rows[j][0]
        lags.append(truth_ms[j][0] - client_ms[i][0])
        if id(req) in warm:
            continue
        seen = Seen(
            ttft_ns=1e9 * ((req.first_token_s or 0) - (req.start_s or 0)),
            span_ns=1e9 * ((req.last_token_s or 0) - (req.first_token_s or 0)),
            tokens=req.output_tokens,
        )
        pairs.append((seen, row))
    set_errors(run, errors(pairs))
    by_send = sorted(matched, key=lambda p: client_ms[p[0]][0])
    by_arrival = sorted(matched, key=lambda p: truth_ms[p[1]][0])
    out_of_order = sum(x != y for x, y in zip(by_send, by_arrival, strict=True))
    lag = pct(lags)
    run.matched = (
        f"{len(matched)}/{len(requests)} by send/token times ({len(rows)} sim lines in the "
        f"window; {out_of_order} pairs out of send order; arrival - send p50 {_fmt(lag['p50'])}"
        f" ms, p99 {_fmt(lag['p99'])} ms; clock offset drift {drift_ms:.3f} ms)"
    )
    spacing_ms = 1e3 / rate
    if lag["p99"] is not None and lag["p99"] > spacing_ms:
        run.note = (
            f"time matching is ambiguous: send-to-arrival lag p99 {lag['p99']:.1f} ms exceeds "
            f"the {spacing_ms:.1f} ms between requests; its error figures are indicative"
        )
    return run


def subtract_startup(run: Run, cpus: list[float]) -> None:
    """Start-up is the median of ``cpus``; CPU figures within its noise are marked n/a."""
    run.startup_cpu_s = statistics.median(cpus)
    spread = max(cpus) - min(cpus)
    net = run.cpu_s - run.startup_cpu_s
    if len(cpus) > 1 and net < 2 * spread:
        why = f"net CPU {net:.2f} s is within start-up noise (start-up runs spread {spread:.2f} s)"
        run.na["cpu_per_request_ms"] = run.na["cpu_per_event_us"] = why


def guidellm_startup(g: Guidellm, url: str, rate: float, repeats: int) -> list[Run]:
    runs = []
    for _ in range(repeats):
        run = run_guidellm(g, url, rate, 1, None, startup=True)
        if run.note:
            raise RuntimeError(run.note)
        runs.append(run)
    return runs


# --------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Plan:
    rates: list[float]
    seconds: float
    load_seconds: float
    workers: tuple[int, ...]
    fractions: tuple[float, ...]
    startup_repeats: int
    cpu_step: tuple[float, int] | None  # (rate, requests) of the fixed-rate CPU comparison


def plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan([50.0, 100.0], 2.0, 3.0, (1,), (0.5,), 1, None)
    rates = [float(r) for r in args.rates.split(",")]
    cpu_step = (args.cpu_rate, args.cpu_requests) if args.cpu_requests > 0 else None
    return Plan(rates, args.seconds, args.load_seconds, (1, 2), (0.25, 0.5, 0.75), 3, cpu_step)


def startup_entry(runs: list[Run]) -> dict[str, Any]:
    cpus = [r.cpu_s for r in runs]
    return {"median_s": statistics.median(cpus), "runs_s": cpus, "wall_s": [r.wall_s for r in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--guidellm",
        type=Path,
        default=guidellm_peer.DEFAULT_VENV,
        help="guidellm's virtual environment (or its guidellm script)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test, under two minutes")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("--seconds", type=float, default=6.0, help="schedule length per step")
    parser.add_argument(
        "--load-seconds", type=float, default=15.0, help="schedule length at 25/50/75%%"
    )
    parser.add_argument(
        "--rates", default="25,50,100,150,200,300", help="offered rates to search, requests/s"
    )
    parser.add_argument(
        "--cpu-rate", type=float, default=50.0, help="rate of the fixed CPU step, requests/s"
    )
    parser.add_argument(
        "--cpu-requests", type=int, default=1500, help="requests of the CPU step (0: none)"
    )
    args = parser.parse_args(argv)
    p = plan(args)

    def say(message: str) -> None:
        if not args.json:
            print(message, file=sys.stderr, flush=True)

    truth_ok = sim_has_truth_log()
    install = guidellm_peer.find(args.guidellm)
    work = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()},
        "mode": "quick" if args.quick else "full",
        "guidellm": {"installed": install is not None, "path": str(args.guidellm)},
    }
    if install is not None:
        results["guidellm"]["version"] = install.version
    t0 = time.monotonic()
    try:
        truth = work / "truth.jsonl" if truth_ok else None
        g = None
        if install is not None:
            say("building guidellm's offline tokenizer")
            try:
                guidellm_peer.build_tokenizer(install, work / "tokenizer")
                g = Guidellm(install, work / "tokenizer", work)
            except (OSError, subprocess.SubprocessError) as exc:
                results["guidellm"]["error"] = f"could not build its tokenizer: {exc}"
        with sim(truth) as url:
            records = work / "r.jsonl"
            startup: dict[int, list[float]] = {}
            entries: dict[str, Any] = {}
            for workers in p.workers:
                say(f"loadgen start-up, workers={workers}")
                runs = [
                    run_loadgen(url, p.rates[0], 1, workers, records)
                    for _ in range(p.startup_repeats)
                ]
                startup[workers] = [r.cpu_s for r in runs]
                entries[f"loadgen workers={workers}"] = startup_entry(runs)
            g_startup: list[float] = []
            if g is not None:
                say("guidellm start-up")
                try:
                    g_runs = guidellm_startup(g, url, p.rates[0], p.startup_repeats)
                    g_startup = [r.cpu_s for r in g_runs]
                    entries["guidellm"] = startup_entry(g_runs)
                except RuntimeError as exc:
                    results["guidellm"]["error"] = str(exc)
                    g = None
            results["startup_cpu_s"] = entries
            # Maximum sustained rate, one process and two workers.
            maxima: dict[int, float] = {}
            steps: list[Run] = []
            for workers in p.workers:
                best = 0.0
                for rate in p.rates:
                    say(f"search: loadgen workers={workers} at {rate:g}/s")
                    n = max(20, int(rate * p.seconds))
                    run = run_loadgen(url, rate, n, workers, records)
                    subtract_startup(run, startup[workers])
                    steps.append(run)
                    if not run.kept_up:
                        break
                    best = rate
                maxima[workers] = best
            results["max_sustained_rps"] = {f"workers={w}": r for w, r in maxima.items()}
            results["search"] = [_row(s) for s in steps]

            # Error, adherence and CPU at fractions of the one-process maximum, both clients.
            def both(label: str, rate: float, n: int) -> tuple[Run, Run | None]:
                say(f"{label}: loadgen at {rate:g}/s, {n} requests")
                since = time.monotonic_ns()
                ours = run_loadgen(url, rate, n, 1, records)
                subtract_startup(ours, startup[1])
                if truth is not None:
                    errs, ours.matched = loadgen_errors(records, read_truth(truth, since))
                    set_errors(ours, errs)
                else:
                    ours.note = "the sim has no --truth-log yet: error not measured"
                if g is None:
                    return ours, None
                say(f"{label}: guidellm at {rate:g}/s, {n} + {WARMUP} requests")
                theirs = run_guidellm(g, url, rate, n, truth)
                subtract_startup(theirs, g_startup)
                return ours, theirs

            loads: list[Run] = []
            comparison = []
            top = maxima[1] or p.rates[0]
            for frac in p.fractions:
                rate = max(1.0, frac * top)
                ours, theirs = both(f"load {frac:.0%}", rate, max(20, int(rate * p.load_seconds)))
                loads += [ours] if theirs is None else [ours, theirs]
                comparison.append(_compare(f"{frac:.0%}", frac, ours, theirs))
            results["at_fraction_of_max"] = [_row(r) for r in loads]
            # CPU at one fixed rate with enough requests to stand well above start-up noise.
            cpu_rows: list[Run] = []
            if p.cpu_step is not None:
                rate, n = p.cpu_step
                ours, theirs = both("cpu step", rate, n)
                cpu_rows += [ours] if theirs is None else [ours, theirs]
                comparison.append(_compare("cpu step", None, ours, theirs))
            results["cpu_step"] = [_row(r) for r in cpu_rows]
            results["comparison"] = comparison
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["bench_wall_s"] = time.monotonic() - t0
    if install is None:
        results["guidellm"]["line"] = guidellm_peer.not_installed_line(args.guidellm)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print_tables(results)
        print(json.dumps(results))
    return 0


def _row(run: Run) -> dict[str, Any]:
    return asdict(run) | {
        "net_cpu_s": run.net_cpu_s,
        "cpu_per_request_ms": run.cpu_per_request_ms,
        "cpu_per_event_us": run.cpu_per_event_us,
        "cpu_per_request_incl_startup_ms": 1e3 * run.cpu_s / run.requests if run.requests else None,
        "kept_up": run.kept_up,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 and a > 0 else None


def _compare(label: str, frac: float | None, ours: Run, theirs: Run | None) -> dict[str, Any]:
    def pair(get: Any) -> dict[str, Any]:
        return {"loadgen": get(ours), "guidellm": get(theirs) if theirs is not None else None}

    out: dict[str, Any] = {"load": label, "fraction": frac, "rate": ours.rate}
    out["requests"] = ours.requests
    out["cpu_per_request_ms"] = pair(lambda r: _unless_na(r, "cpu_per_request_ms"))
    out["cpu_per_event_us"] = pair(lambda r: _unless_na(r, "cpu_per_event_us"))
    out["dispatch_p99_ms"] = pair(lambda r: r.dispatch_p99_ms)
    out["ttft_err_p99_ms"] = pair(lambda r: r.ttft_err_ms.get("p99"))
    out["itl_mean_err_p99_ms"] = pair(lambda r: r.itl_mean_err_ms.get("p99"))
    out["itl_err_p99_ms"] = pair(lambda r: r.itl_err_ms.get("p99"))
    out["kept_up"] = pair(lambda r: r.kept_up)
    cpu = out["cpu_per_request_ms"]
    out["cpu_ratio_guidellm_over_loadgen"] = _ratio(cpu["guidellm"], cpu["loadgen"])
    return out


def _unless_na(run: Run, key: str) -> Any:
    return None if key in run.na else getattr(run, key)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _cell(row: dict[str, Any], key: str, sub: str | None = None) -> str:
    if key in row["na"]:
        return "n/a"
    value = row[key] if sub is None else row[key].get(sub)
    return _fmt(value)


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def _print_tables(results: dict[str, Any]) -> None:
    g = results["guidellm"]
    print(f"mode: {results['mode']}; machine: {results['machine']}")
    if not g["installed"]:
        print(g["line"])
    elif "error" in g:
        print(f"guidellm: {g['version']} from {g['path']} failed: {g['error']}")
    else:
        print(f"guidellm: {g['version']} from {g['path']}")
    print(f"max sustained requests/s (64-token streams): {results['max_sustained_rps']}")
    if g["installed"] and "error" not in g:
        print(f"guidellm max sustained: n/a ({NOT_SEARCHED})")
    print("start-up CPU, s (the same command with one request; median [runs]):")
    for name, entry in results["startup_cpu_s"].items():
        runs = ", ".join(f"{c:.2f}" for c in entry["runs_s"])
        walls = ", ".join(f"{w:.1f}" for w in entry["wall_s"])
        print(f"  {name}: {entry['median_s']:.3f} [{runs}]; wall s [{walls}]")
    print()
    head = ["client", "rate", "w", "ok/sent", "wall s", "kept up", "cpu ms/req", "cpu us/ev"]
    head += ["disp p99", "ttft err p50", "p99", "itl err p50", "p99", "itl-mean err p50", "p99"]
    rows = [head]
    notes: list[str] = []
    for r in [*results["search"], *results["at_fraction_of_max"], *results["cpu_step"]]:
        rows.append(
            [
                r["client"],
                _fmt(r["rate"]),
                _fmt(r["workers"]),
                f"{r['ok']}/{r['requests']}",
                f"{r['wall_s']:.1f}",
                _fmt(r["kept_up"]),
                _cell(r, "cpu_per_request_ms"),
                _cell(r, "cpu_per_event_us"),
                _cell(r, "dispatch_p99_ms"),
                _cell(r, "ttft_err_ms", "p50"),
                _cell(r, "ttft_err_ms", "p99"),
                _cell(r, "itl_err_ms", "p50"),
                _cell(r, "itl_err_ms", "p99"),
                _cell(r, "itl_mean_err_ms", "p50"),
                _cell(r, "itl_mean_err_ms", "p99"),
            ]
        )
        where = f"{r['client']} at {r['rate']:g}/s"
        reasons: dict[str, list[str]] = {}
        for key, why in r["na"].items():
            reasons.setdefault(why, []).append(key)
        notes += [f"{where}: {', '.join(keys)} n/a: {why}" for why, keys in reasons.items()]
        if r["note"]:
            notes.append(f"{where}: {r['note']}")
        if r["matched"]:
            notes.append(f"{where}: truth join {r['matched']}")
    if results["mode"] == "quick":
        print("quick: short runs against a large start-up; CPU figures are rough")
    print("all figures in ms except cpu us/ev; cpu net of start-up; errors vs the sim's truth log")
    _table(rows)
    if notes:
        print("notes:")
        for note in dict.fromkeys(notes):
            print(f"  {note}")
    if not g["installed"] or "error" in g:
        return
    print()
    print(
        "side by side (loadgen | guidellm), at fractions of loadgen's one-process maximum "
        "and at the fixed-rate cpu step:"
    )
    head = ["load", "rate", "cpu ms/req", "ratio g/l", "cpu us/event", "ttft err p99"]
    head += ["itl-mean err p99", "dispatch p99", "kept up"]
    rows = [head]
    for c in results["comparison"]:

        def both(key: str, c: dict[str, Any] = c) -> str:
            return f"{_fmt(c[key]['loadgen'])} | {_fmt(c[key]['guidellm'])}"

        ratio = c["cpu_ratio_guidellm_over_loadgen"]
        rows.append(
            [
                c["load"],
                _fmt(c["rate"]),
                both("cpu_per_request_ms"),
                "-" if ratio is None else f"{ratio:.1f}x",
                both("cpu_per_event_us"),
                both("ttft_err_p99_ms"),
                both("itl_mean_err_p99_ms"),
                both("dispatch_p99_ms"),
                both("kept_up"),
            ]
        )
    _table(rows)


if __name__ == "__main__":
    raise SystemExit(main())
