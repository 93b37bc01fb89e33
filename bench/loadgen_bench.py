"""How fast and how exact is loadgen's client, beside guidellm's, against the sim engine.

Run: ``.venv/bin/python bench/loadgen_bench.py [--guidellm-python PATH] [--json]``.

Everything runs on this host: the sim engine (``python -m gate.engines.sim``, started as a
process; nothing from ``gate`` is imported) with short TTFT/ITL, one token per event and its
``--truth-log``, which records for every request (joined on our ``X-Request-Id``) when it
arrived and when each event was emitted, on the same monotonic clock as ours. Measured:

- maximum sustained rate: the highest offered rate (64-token streams) at which every request
  succeeds, the p99 dispatch delay stays under 10 ms and the achieved token throughput keeps
  within 10% of the offered one; for one loadgen process and for ``--workers 2``. On a
  two-core machine the sim shares the CPU, so this is a system figure; the client's own CPU
  per request is the figure that compares clients;
- measurement error against the truth log at 25/50/75% of that maximum: per request
  ``|(first_token_ns - sent_ns) - (first event emitted - arrival)|`` for TTFT and, per token,
  ``|client gap - emitted gap|`` for ITL (events paired by position); p50 and p99;
- schedule adherence: p99 dispatch delay at the same loads;
- client CPU per request and per streamed event, from the client process's own accounting
  (``getrusage(RUSAGE_CHILDREN)`` around the client subprocess; workers included);
- the same CPU figures for guidellm's client when ``--guidellm-python`` points at a Python
  with guidellm installed, run against the same sim.

Figures from a busy machine are disturbed (other processes share the two cores); rerun on a
quiet one for reference numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MAX_TOKENS = 64
PROMPT_TOKENS = 16
SIM_FLAGS = ["--load-s", "0", "--warmup-s", "0", "--ttft-ms", "5", "--itl-ms", "2"]
SIM_FLAGS += ["--jitter", "0", "--tokens-per-event", "1", "--prefill-us-per-token", "0"]


@dataclass
class Run:
    client: str
    rate: float
    workers: int = 1
    requests: int = 0
    ok: int = 0
    cpu_s: float = 0.0
    events: int = 0
    wall_s: float = 0.0
    achieved_tokens_per_s: float = 0.0
    dispatch_p99_ms: float | None = None
    ttft_err_ms: dict[str, float | None] = field(default_factory=dict)
    itl_err_ms: dict[str, float | None] = field(default_factory=dict)
    note: str = ""

    @property
    def cpu_per_request_ms(self) -> float | None:
        return 1e3 * self.cpu_s / self.requests if self.requests else None

    @property
    def cpu_per_event_us(self) -> float | None:
        return 1e6 * self.cpu_s / self.events if self.events else None


@contextlib.contextmanager
def sim(truth_log: Path | None) -> Iterator[str]:
    flags = [*SIM_FLAGS, *(["--truth-log", str(truth_log)] if truth_log else [])]
    proc = subprocess.Popen(
        [PYTHON, "-m", "gate.engines.sim", "--port", "0", *flags],
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
        [PYTHON, "-m", "gate.engines.sim", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    return "--truth-log" in out.stdout


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_loadgen(url: str, rate: float, seconds: float, workers: int, records: Path) -> Run:
    n = max(20, int(rate * seconds))
    argv = [PYTHON, "-m", "loadgen", "--url", url, "--rate", f"{rate:g}", "--requests", str(n)]
    argv += ["--max-tokens", str(MAX_TOKENS), "--prompt-tokens", str(PROMPT_TOKENS)]
    argv += ["--ignore-eos", "--json", "--records", str(records), "--tokenizer", "estimate"]
    argv += ["--workers", str(workers), "--warmup", "4", "--seed", str(int(rate))]
    before = children_cpu()
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.monotonic() - start
    cpu = children_cpu() - before
    run = Run("loadgen", rate, workers, requests=n, cpu_s=cpu, wall_s=wall)
    if out.returncode not in (0, 1):
        run.note = f"exit {out.returncode}: {out.stderr[-300:]}"
        return run
    summary = json.loads(out.stdout)
    run.ok = summary["requests"]["ok"]
    run.dispatch_p99_ms = summary["dispatch_delay_ms"]["p99"]
    tput = summary["throughput"]["output_tokens_per_s"] or 0.0
    run.achieved_tokens_per_s = tput
    recs = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    run.events = sum(len(r["chunk_ns"]) + 2 for r in recs)  # + the usage chunk and [DONE]
    return run


def sustained(run: Run) -> bool:
    """Every request ok, dispatch on time, and tokens streamed at 90% of the offered rate
    (the run's duration includes the last stream's tail, hence the slack)."""
    offered = run.rate * MAX_TOKENS
    return (
        run.ok == run.requests
        and run.dispatch_p99_ms is not None
        and run.dispatch_p99_ms <= 10.0
        and run.achieved_tokens_per_s >= 0.8 * offered
    )


def truth_errors(records: Path, truth: Path, since_ns: int) -> tuple[list[float], list[float]]:
    """TTFT and per-token ITL errors in ms, for records joined to truth lines by request id."""
    by_id: dict[str, dict[str, Any]] = {}
    for line in truth.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if row.get("arrival_ns", 0) >= since_ns and row.get("request_id") is not None:
                by_id[str(row["request_id"])] = row
    ttft: list[float] = []
    itl: list[float] = []
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        row = by_id.get(str(rec["request_id"]))
        if row is None or rec["first_token_ns"] is None or rec["error_kind"] is not None:
            continue
        events = [e for e in row["events"] if e[1] > 0]
        if not events:
            continue
        client = rec["first_token_ns"] - rec["sent_ns"]
        true = events[0][0] - row["arrival_ns"]
        ttft.append(abs(client - true) / 1e6)
        ts = rec["chunk_ns"]
        if len(ts) == len(events):
            for j in range(1, len(ts)):
                k = max(1, events[j][1])
                gap_c = (ts[j] - ts[j - 1]) / k
                gap_t = (events[j][0] - events[j - 1][0]) / k
                itl.extend([abs(gap_c - gap_t) / 1e6] * k)
    return ttft, itl


def pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(values, [50, 99]).tolist()
    return {"p50": p50, "p99": p99}


def run_guidellm(python: str, url: str, rate: float, requests: int, workdir: Path) -> Run:
    """guidellm's own CLI, constant rate, synthetic data; CPU from its process accounting."""
    run = Run("guidellm", rate, requests=requests)
    exe = Path(python).with_name("guidellm")
    argv = [str(exe), "run", "--target", url, "--profile", "constant", "--rate", f"{rate:g}"]
    argv += ["--max-requests", str(requests), "--model", "demo-model"]
    argv += ["--data", f"prompt_tokens={PROMPT_TOKENS},output_tokens={MAX_TOKENS}"]
    argv += ["--processor", "gpt2", "--output-path", str(workdir / "guidellm.json")]
    argv += ["--disable-console-interactive"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    before = children_cpu()
    start = time.monotonic()
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, cwd=workdir, env=env, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        run.note = f"could not run guidellm: {exc}"
        return run
    run.wall_s = time.monotonic() - start
    run.cpu_s = children_cpu() - before
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        run.note = f"guidellm exited {out.returncode}: {' | '.join(tail)[:400]}"
        return run
    run.ok = requests
    run.events = requests * (MAX_TOKENS + 2)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guidellm-python", help="a Python with guidellm installed")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("--seconds", type=float, default=6.0, help="schedule length per step")
    parser.add_argument(
        "--rates", default="25,50,100,150,200,300", help="offered rates to search, requests/s"
    )
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    truth_ok = sim_has_truth_log()
    work = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
    try:
        truth = work / "truth.jsonl" if truth_ok else None
        with sim(truth) as url:
            # Maximum sustained rate, one process and two workers.
            maxima: dict[int, float] = {}
            steps: list[Run] = []
            for workers in (1, 2):
                best = 0.0
                for rate in rates:
                    run = run_loadgen(url, rate, args.seconds, workers, work / "r.jsonl")
                    steps.append(run)
                    if not sustained(run):
                        break
                    best = rate
                maxima[workers] = best
            results["max_sustained_rps"] = {f"workers={w}": r for w, r in maxima.items()}
            results["search"] = [asdict(s) | _derived(s) for s in steps]
            # Error and adherence at fractions of the one-process maximum.
            loads: list[Run] = []
            top = maxima[1] or rates[0]
            for frac in (0.25, 0.5, 0.75):
                rate = max(1.0, frac * top)
                since = time.monotonic_ns()
                run = run_loadgen(url, rate, args.seconds, 1, work / "r.jsonl")
                if truth is not None:
                    ttft, itl = truth_errors(work / "r.jsonl", truth, since)
                    run.ttft_err_ms, run.itl_err_ms = pct(ttft), pct(itl)
                else:
                    run.note = "the sim has no --truth-log yet: error not measured"
                loads.append(run)
            results["at_fraction_of_max"] = [asdict(r) | _derived(r) for r in loads]
            if args.guidellm_python:
                g = run_guidellm(args.guidellm_python, url, max(1.0, 0.5 * top), 200, work)
                results["guidellm"] = asdict(g) | _derived(g)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print_table(results)
        print(json.dumps(results))
    return 0


def _derived(run: Run) -> dict[str, float | None]:
    return {"cpu_per_request_ms": run.cpu_per_request_ms, "cpu_per_event_us": run.cpu_per_event_us}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _print_table(results: dict[str, Any]) -> None:
    print(f"max sustained requests/s (64-token streams): {results['max_sustained_rps']}")
    head = ["client", "rate", "workers", "ok/sent", "cpu ms/req", "cpu us/event", "dispatch p99"]
    head += ["ttft err p50", "ttft err p99", "itl err p50", "itl err p99", "note"]
    rows = [head]
    for r in [*results["search"], *results["at_fraction_of_max"], *(
        [results["guidellm"]] if "guidellm" in results else []
    )]:  # fmt: skip
        rows.append(
            [
                r["client"],
                _fmt(r["rate"]),
                _fmt(r["workers"]),
                f"{r['ok']}/{r['requests']}",
                _fmt(r["cpu_per_request_ms"]),
                _fmt(r["cpu_per_event_us"]),
                _fmt(r["dispatch_p99_ms"]),
                _fmt(r["ttft_err_ms"].get("p50")),
                _fmt(r["ttft_err_ms"].get("p99")),
                _fmt(r["itl_err_ms"].get("p50")),
                _fmt(r["itl_err_ms"].get("p99")),
                r["note"][:60],
            ]
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
