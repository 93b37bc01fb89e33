"""Benchmark of the sim engine: how many SSE events it sustains, and how punctually it emits.

    .venv/bin/python bench/sim_bench.py [--workers N] [--json]

What it measures:

* Maximum sustained SSE events/s and streamed tokens/s of one sim process: zero-cost steps
  (``--itl-ms 0``), so the engine loop runs flat out and the process's CPU is the limit.
  Once with one token per event, once with several (``--tokens-per-event``).
* The same with ``--workers N``: N sim processes on N ports, each driven by its own client
  process, summed.
* Emission accuracy at 25/50/75% of the one-process maximum: the step time is set so the
  batch produces that many events per second, and the sim's ``--truth-log`` gives, for every
  content event, when the model scheduled it and when its bytes went to the socket; the table
  shows p50/p99/max of the difference.

The client is not httpx: each client process runs raw ``asyncio.Protocol`` connections that
send a pre-encoded request and count ``data: {`` occurrences in what arrives, with no parsing,
keep-alive, and the next request sent as soon as one ends (closed loop). That costs a few
microseconds per event, well under the sim's cost, and each run prints both processes' CPU
use, so a client near 100% would show it was the limit. Sims and clients are separate
processes: on a machine with fewer cores than processes the figures are shared-CPU figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from simengine.launch import SimHandle, launch  # noqa: E402

BUCKET_NS = 50_000_000
SIM_BASE = (
    "--profile", "tiny", "--load-s", "0", "--warmup-s", "0", "--jitter", "0",
    "--itl-per-running-ms", "0", "--prefill-us-per-token", "0", "--ttft-ms", "0",
    "--max-num-batched-tokens", "65536",
)  # fmt: skip


# --------------------------------------------------------------------------- client


class _Stream(asyncio.Protocol):
    """One keep-alive connection streaming completions back to back."""

    def __init__(self, request: bytes, buckets: list[int], t0: int, until: int) -> None:
        self._request = request
        self._buckets = buckets
        self._t0 = t0
        self._until = until
        self._tail = b""
        self._transport: asyncio.Transport | None = None
        self.requests = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        buf = self._tail + data
        n = buf.count(b"data: {")
        if n:
            now = time.monotonic_ns()
            idx = (now - self._t0) // BUCKET_NS
            if 0 <= idx < len(self._buckets):
                self._buckets[idx] += n
        if buf.endswith(b"0\r\n\r\n"):
            self.requests += 1
            self._tail = b""
            assert self._transport is not None
            if time.monotonic_ns() < self._until:
                self._transport.write(self._request)
            else:
                self._transport.close()
        else:
            # Long enough that a marker split across reads is counted once.
            self._tail = buf[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def stream_lengths(streams: int, max_tokens: int, spread: float) -> list[int]:
    """Output lengths spaced evenly over max_tokens x [1 - spread, 1 + spread] (mean
    max_tokens). spread 0: every stream the same length, so all finish together and their
    replacements arrive in one burst, the worst case for the sim's single event loop."""
    if streams == 1 or spread == 0:
        return [max_tokens] * streams
    return [
        max(1, round(max_tokens * (1 - spread + 2 * spread * k / (streams - 1))))
        for k in range(streams)
    ]


def _request(max_tokens: int) -> bytes:
    body = json.dumps(
        {"prompt": "x", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
         "temperature": 0}
    ).encode()  # fmt: skip
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )


async def _client(
    port: int, streams: int, max_tokens: int, duration_s: float, spread: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    t0 = time.monotonic_ns()
    until = t0 + int(duration_s * 1e9)
    buckets = [0] * (int(duration_s * 1e9) // BUCKET_NS + 40)
    conns = []
    for length in stream_lengths(streams, max_tokens, spread):
        request = _request(length)
        _, proto = await loop.create_connection(
            lambda request=request: _Stream(request, buckets, t0, until),
            "127.0.0.1",
            port,
        )
        conns.append(proto)
    cpu0 = time.process_time()
    await asyncio.wait_for(asyncio.gather(*(c.closed for c in conns)), duration_s + 60)
    return {
        "t0_ns": t0,
        "bucket_ns": BUCKET_NS,
        "buckets": buckets,
        "requests": sum(c.requests for c in conns),
        "cpu_s": time.process_time() - cpu0,
    }


def client_main(args: list[str]) -> None:
    port, streams, max_tokens, duration = int(args[0]), int(args[1]), int(args[2]), float(args[3])
    spread = float(args[4]) if len(args) > 4 else 0.0
    result = asyncio.run(_client(port, streams, max_tokens, duration, spread))
    print(json.dumps(result))


# --------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class Load:
    """What each client process offers its sim: closed-loop streams for a fixed time."""

    streams: int
    max_tokens: int
    duration_s: float
    warmup_s: float
    spread: float = 0.5


@dataclass
class Run:
    name: str
    processes: int
    streams: int
    tokens_per_event: int
    target_events_per_s: float | None
    events_per_s: float = 0.0
    tokens_per_s: float = 0.0
    sim_cpu: float = 0.0
    client_cpu: float = 0.0
    emission_error_ms: dict[str, float] = field(default_factory=dict)


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return float(values[min(len(values) - 1, int(q * len(values)))])


def run_case(
    name: str,
    load: Load,
    *,
    processes: int,
    tokens_per_event: int,
    itl_ms: float,
    target: float | None,
    workdir: Path,
) -> Run:
    """Start ``processes`` sims, drive each with its own client process, read their truth."""
    streams, duration_s, warmup_s = load.streams, load.duration_s, load.warmup_s
    sims: list[SimHandle] = []
    slug = "".join(c if c.isalnum() else "_" for c in name)
    logs = [workdir / f"{slug}-{i}.jsonl" for i in range(processes)]
    try:
        for log in logs:
            sims.append(
                launch(
                    [
                        *SIM_BASE,
                        "--itl-ms",
                        str(itl_ms),
                        "--max-num-seqs",
                        str(streams),
                        "--tokens-per-event",
                        str(tokens_per_event),
                        "--truth-log",
                        str(log),
                    ],
                    cwd=REPO,
                    stderr_path=log.with_suffix(".stderr"),
                )
            )
        cpu_before = [_proc_cpu_s(s.proc.pid) for s in sims]
        clients = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--client",
                    str(s.port),
                    str(streams),
                    str(load.max_tokens),
                    str(duration_s),
                    str(load.spread),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for s in sims
        ]
        outs = [c.communicate(timeout=duration_s + 90)[0] for c in clients]
        cpu_after = [_proc_cpu_s(s.proc.pid) for s in sims]
    finally:
        for s in sims:
            s.stop()
    results = [json.loads(o) for o in outs]
    window = duration_s - warmup_s
    first = int(warmup_s * 1e9) // BUCKET_NS
    last = int(duration_s * 1e9) // BUCKET_NS
    events = sum(sum(r["buckets"][first:last]) for r in results)
    run = Run(name, processes, streams, tokens_per_event, target)
    run.events_per_s = events / window
    run.tokens_per_s = run.events_per_s * tokens_per_event
    run.sim_cpu = sum(b - a for a, b in zip(cpu_before, cpu_after, strict=True)) / (
        duration_s * processes
    )
    run.client_cpu = sum(r["cpu_s"] for r in results) / (duration_s * processes)

    errors: list[int] = []
    for log, r in zip(logs, results, strict=True):
        lo = r["t0_ns"] + int(warmup_s * 1e9)
        hi = r["t0_ns"] + int(duration_s * 1e9)
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            for (emitted, _), scheduled in zip(rec["events"], rec["scheduled_ns"], strict=True):
                if lo <= scheduled <= hi:
                    errors.append(emitted - scheduled)
    run.emission_error_ms = {
        "p50": _percentile(errors, 0.50) / 1e6,
        "p99": _percentile(errors, 0.99) / 1e6,
        "max": (max(errors) if errors else float("nan")) / 1e6,
        "events": float(len(errors)),
    }
    return run


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="sim processes for the scale run")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams per sim")
    parser.add_argument("--max-tokens", type=int, default=256, help="mean tokens per request")
    parser.add_argument(
        "--length-spread",
        type=float,
        default=0.5,
        help="output lengths spread over max-tokens x [1-s, 1+s] (default 0.5, a realistic mix); "
        "0: all equal, so streams finish in lockstep (the worst case for request intake)",
    )
    parser.add_argument("--tokens-per-event", type=int, default=4, help="for the multi-token run")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds not counted")
    args = parser.parse_args()
    load = Load(args.streams, args.max_tokens, args.duration, args.warmup, args.length_spread)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        workdir = Path(tmp)
        peak = run_case(
            "max 1 process",
            load,
            processes=1,
            tokens_per_event=1,
            itl_ms=0,
            target=None,
            workdir=workdir,
        )
        runs.append(peak)
        runs.append(
            run_case(
                f"max 1 process, {args.tokens_per_event} tok/event",
                load,
                processes=1,
                tokens_per_event=args.tokens_per_event,
                itl_ms=0,
                target=None,
                workdir=workdir,
            )
        )
        if args.workers > 1:
            runs.append(
                run_case(
                    f"max {args.workers} processes",
                    load,
                    processes=args.workers,
                    tokens_per_event=1,
                    itl_ms=0,
                    target=None,
                    workdir=workdir,
                )
            )
        for frac in (0.25, 0.50, 0.75):
            target = frac * peak.events_per_s
            # Every stream is in the batch, so each step emits `streams` events.
            itl_ms = args.streams / target * 1000
            runs.append(
                run_case(
                    f"{frac:.0%} of max",
                    load,
                    processes=1,
                    tokens_per_event=1,
                    itl_ms=itl_ms,
                    target=target,
                    workdir=workdir,
                )
            )
    machine = {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "python": sys.version}
    half = next(r for r in runs if r.name == "50% of max")
    targets = {
        "events_per_s_per_process": {"want": 10_000, "got": peak.events_per_s},
        "p99_emission_error_ms_at_50pct": {"want": 1.0, "got": half.emission_error_ms["p99"]},
    }
    met = {
        "events_per_s_per_process": peak.events_per_s >= 10_000,
        "p99_emission_error_ms_at_50pct": half.emission_error_ms["p99"] <= 1.0,
    }
    if args.json:
        doc = {"machine": machine, "runs": [asdict(r) for r in runs], "targets": targets}
        doc["targets_met"] = met
        print(json.dumps(doc))
        return
    print(
        f"sim benchmark: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"{args.streams} streams x {args.max_tokens} tokens (spread {args.length_spread:g}) "
        "per sim; raw asyncio client, "
        "one client process per sim"
    )
    head = (
        f"{'run':<28}{'procs':>6}{'target ev/s':>13}{'events/s':>11}{'tokens/s':>11}"
        f"{'sim CPU':>9}{'client CPU':>12}{'err p50 ms':>12}{'p99 ms':>9}{'max ms':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in runs:
        shown = f"{r.target_events_per_s:,.0f}" if r.target_events_per_s else "-"
        err = r.emission_error_ms
        accuracy = (
            f"{err['p50']:>12.3f}{err['p99']:>9.3f}{err['max']:>9.2f}"
            if r.target_events_per_s
            else f"{'-':>12}{'-':>9}{'-':>9}"
        )
        print(
            f"{r.name:<28}{r.processes:>6}{shown:>13}{r.events_per_s:>11,.0f}"
            f"{r.tokens_per_s:>11,.0f}{r.sim_cpu:>9.0%}{r.client_cpu:>12.0%}{accuracy}"
        )
    print(
        "emission error = time the event's bytes reached the socket minus the time the "
        "performance model scheduled it (from --truth-log); CPU = CPU seconds per wall second "
        "per process."
    )
    verdict = {True: "met", False: "MISSED"}
    print(
        f"targets: >= 10,000 events/s per process: {verdict[met['events_per_s_per_process']]} "
        f"({peak.events_per_s:,.0f}); p99 emission error <= 1 ms at 50% load: "
        f"{verdict[met['p99_emission_error_ms_at_50pct']]} "
        f"({half.emission_error_ms['p99']:.3f} ms)"
    )


if __name__ == "__main__":
    main()
