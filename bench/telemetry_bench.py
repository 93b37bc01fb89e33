"""What sampling the engines' metrics costs the gate: client CPU per scrape, and its effect on
the TTFT the gate measures, as a ratio of the same load with and without scraping in one run.

Run: ``.venv/bin/python bench/telemetry_bench.py [--quick] [--json]``.

- CPU per scrape: the sampler thread's own CPU (``time.thread_time``, Sampler.cpu_s) over its
  scrapes, against a metrics endpoint that serves real vLLM 0.32's /metrics body (54 kB,
  tests/support/captures/vllm/vllm-metrics.http) from a separate process (``python -m
  http.server``, so serving costs this process nothing), and against the sim's own /metrics.
- TTFT error: load (loadgen's ``run_paired``, in this process as in the gate) against the sim
  with its ``--truth-log``, in alternating blocks with and without a sampler scraping both
  endpoints on a thread of this process, at ``--interval`` (default 0.1 s: ten times the
  gate's default rate, so the effect is measurable). Per request, |client TTFT - the sim's own
  (first event emitted - arrival)|; p50 and p99 of each mode, and their ratio (with / without).
  Blocks alternate so that a drift of the machine falls on both modes alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen_bench

from gate.telemetry import PrometheusSource, Sampler
from loadgen.client import RequestSpec, Target
from loadgen.runner import run_paired

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "support" / "captures" / "vllm" / "vllm-metrics.http"


@contextlib.contextmanager
def vllm_body_server() -> Iterator[str]:
    """The captured vLLM /metrics body at /metrics, served by another process."""
    with tempfile.TemporaryDirectory() as tmp:
        body = CAPTURE.read_text().split("\n\n", 1)[1]
        Path(tmp, "metrics").write_text(body)
        port = loadgen_bench_free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.5)
            yield f"http://127.0.0.1:{port}/metrics"
        finally:
            proc.terminate()
            proc.wait(10)


def loadgen_bench_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_per_scrape(url: str, scrapes: int) -> dict[str, float]:
    src = PrometheusSource(url, url)
    sampler = Sampler({"x": [src]}, interval_s=0.01)
    start = time.thread_time()
    for _ in range(scrapes):
        sampler.tick()
    cpu = time.thread_time() - start
    src.close()
    tl = sampler.timelines["x"]
    assert tl.gaps == 0, tl.notes
    return {"scrapes": scrapes, "cpu_ms_per_scrape": 1e3 * cpu / scrapes}


async def one_block(url: str, rate: float, n: int, first_id: int) -> list[Any]:
    reqs = [RequestSpec(first_id + i, "hello " * 16, 32) for i in range(n)]
    offsets = np.arange(n, dtype=np.float64) / rate
    result = await run_paired([Target("sim", url)], reqs, offsets_s=offsets)
    return [r for r in result.records["sim"] if r.ok and r.first_token_ns is not None]


def ttft_errors(records: list[Any], rows: list[dict[str, Any]]) -> list[float]:
    by_id = {str(r["request_id"]): r for r in rows}
    pairs = []
    for rec in records:
        row = by_id.get(str(rec.request_id))
        if row is not None:
            pairs.append((loadgen_bench.Seen(ttft_ns=rec.first_token_ns - rec.sent_ns), row))
    return loadgen_bench.errors(pairs).ttft


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke test (about 30 s)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rate", type=float, default=50.0, help="requests per second of the load")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between scrapes")
    ap.add_argument("--blocks", type=int, default=8, help="blocks per mode, alternating")
    args = ap.parse_args(argv)
    block_n = 100 if args.quick else 300
    blocks = 2 if args.quick else args.blocks
    out: dict[str, Any] = {"rate": args.rate, "interval_s": args.interval}
    with tempfile.TemporaryDirectory() as tmp, vllm_body_server() as vllm_url:
        truth = Path(tmp) / "truth.jsonl"
        with loadgen_bench.sim(truth) as sim_url:
            n = 50 if args.quick else 300
            out["cpu_vllm_body"] = cpu_per_scrape(vllm_url, n)
            out["cpu_sim"] = cpu_per_scrape(sim_url + "/metrics", n)
            errs: dict[str, list[float]] = {"off": [], "on": []}
            next_id = 0
            for b in range(2 * blocks):
                mode = "on" if b % 2 else "off"
                sampler = None
                if mode == "on":
                    srcs = [
                        PrometheusSource("vllm", vllm_url),
                        PrometheusSource("sim", sim_url + "/metrics"),
                    ]
                    sampler = Sampler({"x": srcs}, interval_s=args.interval)
                    sampler.start()
                since = time.monotonic_ns()
                recs = asyncio.run(one_block(sim_url, args.rate, block_n, next_id))
                next_id += block_n
                if sampler is not None:
                    sampler.stop()
                rows = loadgen_bench.read_truth(truth, since)
                errs[mode].extend(ttft_errors(recs, rows))
    for mode, e in errs.items():
        out[f"ttft_error_{mode}"] = {"requests": len(e), **loadgen_bench.pct(e)}
    on, off = out["ttft_error_on"], out["ttft_error_off"]
    out["ratio_p50"] = on["p50"] / off["p50"] if off["p50"] else None
    out["ratio_p99"] = on["p99"] / off["p99"] if off["p99"] else None
    share = out["cpu_vllm_body"]["cpu_ms_per_scrape"] * 2 / 1e3  # two engines, 1 scrape/s
    out["core_share_at_1s_two_vllm"] = share
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    if shutil.which(sys.executable) is None:
        raise SystemExit("no python")
    raise SystemExit(main())
