"""One BLAS thread per gate process (gate/core/threads.py; bench/blas_bench.py measures why)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json
import numpy
from threadpoolctl import threadpool_info
before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
from gate.core.threads import one_blas_thread
one_blas_thread()
after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
print(json.dumps({"before": before, "after": after}))
"""


def test_a_fresh_process_keeps_one_blas_thread_from_then_on() -> None:
    """In a process of its own (this one's conftest already limited it): numpy's BLAS is found,
    and every BLAS pool says one thread afterwards, whatever it had before."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(done.stdout)
    assert got["before"], "numpy's BLAS was not found by threadpoolctl"
    assert got["after"] == [1] * len(got["before"])
