"""Benchmark: the judge's bootstrap with the host's BLAS threads against one BLAS thread, on a
host whose cores are busy (gate/core/threads.py says why a gate process keeps one).

Runs 160 block-bootstrap interval computations (two arms of 2,500 batched lognormal samples,
p50 and p90: what a gate's latency checks do) in a child process, once with OpenBLAS's default
pool and once limited to one thread by threadpoolctl, alternately `--repeat` times, beside
`--busy` processes that spin at normal priority while the child runs at `nice 10` (the shape of
`make test`: the parallel run niced beside real vLLM). Prints each run's wall and CPU seconds
and the ratio of the medians. With `--busy 0` it measures an idle host.

    .venv/bin/python bench/blas_bench.py [--busy 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
import numpy as np
if sys.argv[1] == "one":
    from gate.core.threads import one_blas_thread
    one_blas_thread()
from gate.analysis.estimates import bootstrap_ratio_intervals
rng = np.random.default_rng(11)
def batched(n, batch=50):
    shared = np.repeat(rng.normal(0.0, 0.4, n // batch + 1), batch)[:n]
    return np.exp(rng.normal(0.0, 0.2, n) + shared)
wall, cpu = time.perf_counter(), time.process_time()
for r in range(160):
    bootstrap_ratio_intervals(batched(2500), batched(2500), [0.5, 0.9], seed=r)
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))
"""


def spin() -> None:
    while True:
        pass


def run(mode: str) -> dict[str, float]:
    done = subprocess.run(
        ["nice", "-n", "10", sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=int, default=3, help="spinning processes beside (default 3)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each mode (default 3)")
    args = ap.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    walls: dict[str, list[float]] = {"default": [], "one": []}
    try:
        for i in range(args.repeat):
            for mode in ("default", "one"):
                got = run(mode)
                walls[mode].append(got["wall"])
                print(
                    f"run {i + 1}/{args.repeat} {mode:>7} BLAS threads: "
                    f"wall {got['wall']:6.2f} s, cpu {got['cpu']:6.2f} s",
                    flush=True,
                )
    finally:
        for p in spinners:
            p.terminate()
    ratio = statistics.median(walls["default"]) / statistics.median(walls["one"])
    print(
        f"median wall: default {statistics.median(walls['default']):.2f} s, one thread "
        f"{statistics.median(walls['one']):.2f} s: the default takes {ratio:.1f}x "
        f"({args.busy} busy processes, {multiprocessing.cpu_count()} cores)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
