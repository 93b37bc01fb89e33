"""The verdict-endpoint bench runs end to end at a tiny size: the real `gate serve` and the
peer answer every poll of a finished and of a running gate; the figures are well formed.
(The figures themselves come from a full run by hand: `bench/api_bench.py`.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "api_bench.py"


def test_api_bench_runs_and_reports_every_target() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--pollers", "8", "--duration", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=400,  # the bench waits up to 120 s for each server on a busy host
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for mode in ("paced", "saturated"):
        for name in ("gate", "running", "peer"):
            f = doc["results"][mode][name]
            assert f["errors"] == 0 and f["requests"] > 0, (mode, name, f)
            assert 0 < f["p50_ms"] <= f["p90_ms"] <= f["p99_ms"]
        for name in ("gate", "running"):
            assert doc["gate_over_peer"][f"{mode}/{name}"]["p50"] > 0
