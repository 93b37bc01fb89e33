"""The loadgen bench's own arithmetic: truth errors, guidellm report reading and matching.

No sim and no guidellm run here; the bench itself is run by hand (``bench/loadgen_bench.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import guidellm_peer  # noqa: E402
import loadgen_bench  # noqa: E402

MS = 1_000_000


def truth_row(arrival_ms: float, first_ms: float, n: int, gap_ms: float) -> dict[str, Any]:
    events = [[round((first_ms + i * gap_ms) * MS), 1] for i in range(n)]
    return {
        "request_id": "x",
        "status": 200,
        "arrival_ns": round(arrival_ms * MS),
        "events": events,
    }


def test_errors_ttft_per_token_and_mean_itl() -> None:
    row = truth_row(0.0, 5.0, 4, 2.0)  # events at 5, 7, 9, 11 ms after arrival
    chunks = [round(t * MS) for t in (106.0, 108.5, 110.0, 112.0)]  # client clock, sent at 100
    seen = loadgen_bench.Seen(
        ttft_ns=6.0 * MS, span_ns=6.0 * MS, tokens=4, first_tokens=1, chunk_ns=chunks
    )
    errs = loadgen_bench.errors([(seen, row)])
    assert errs.ttft == pytest.approx([1.0])
    assert errs.itl == pytest.approx([0.5, 0.5, 0.0])
    assert errs.itl_mean == pytest.approx([0.0])  # (112 - 106) / 3 == (11 - 5) / 3


def test_errors_without_per_token_times_give_only_ttft_and_mean() -> None:
    row = truth_row(0.0, 5.0, 5, 2.0)
    seen = loadgen_bench.Seen(ttft_ns=5.2 * MS, span_ns=8.8 * MS, tokens=5)
    errs = loadgen_bench.errors([(seen, row)])
    assert errs.ttft == pytest.approx([0.2])
    assert errs.itl == []
    assert errs.itl_mean == pytest.approx([0.2])  # 8.8 / 4 against 2.0


def test_cpu_per_request_is_net_of_start_up() -> None:
    run = loadgen_bench.Run("loadgen", 50.0, requests=101, ok=101, cpu_s=1.5, events=101 * 66)
    assert run.cpu_per_request_ms is None
    run.startup_cpu_s = 0.5
    assert run.cpu_per_request_ms == pytest.approx(10.0)  # 1.0 s over the other 100 requests
    assert run.cpu_per_event_us == pytest.approx(10_000 / 66)


def test_cpu_within_start_up_noise_is_not_a_figure() -> None:
    run = loadgen_bench.Run("guidellm", 6.25, requests=93, ok=93, cpu_s=23.3, events=93 * 66)
    loadgen_bench.subtract_startup(run, [23.9, 22.8, 24.8])
    assert run.startup_cpu_s == pytest.approx(23.9)
    assert "cpu_per_request_ms" in run.na
    assert loadgen_bench._compare("25%", 0.25, run, None)["cpu_per_request_ms"]["loadgen"] is None
    ok = loadgen_bench.Run("loadgen", 50.0, requests=751, ok=751, cpu_s=4.5, events=751 * 66)
    loadgen_bench.subtract_startup(ok, [0.55, 0.57, 0.66])
    assert ok.na == {}
    assert ok.cpu_per_request_ms == pytest.approx(1e3 * (4.5 - 0.57) / 750)


def test_match_by_time_follows_token_times_not_send_order() -> None:
    # Two requests sent 10 ms apart; the first one's request reached the server late (its
    # send-to-arrival lag exceeds the spacing), so pairing by send order would swap them.
    client = [(0.0, 46.0, 90.0), (10.0, 16.5, 60.5)]
    truth = [(11.0, 16.0, 60.0), (40.0, 45.0, 89.0)]
    assert guidellm_peer.match_by_time(client, truth) == [(0, 1), (1, 0)]


def test_match_by_time_refuses_non_causal_pairs() -> None:
    # The only truth line was emitted after the client had already received its tokens.
    assert guidellm_peer.match_by_time([(0.0, 5.0, 9.0)], [(1.0, 20.0, 24.0)]) == []
    assert guidellm_peer.match_by_time([], [(1.0, 2.0, 3.0)]) == []


def test_load_report_reads_timings_in_send_order(tmp_path: Path) -> None:
    def item(start: float, status: str) -> dict[str, Any]:
        timings = {
            "targeted_start": start - 0.001,
            "request_start": start,
            "first_token_iteration": start + 0.005,
            "last_token_iteration": start + 0.1,
            "request_end": start + 0.101,
            "request_iterations": 66,
        }
        return {"info": {"status": status, "timings": timings}, "output_tokens": 64}

    requests = {"successful": [item(2.0, "completed"), item(1.0, "completed")], "errored": []}
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"benchmarks": [{"requests": requests}]}))
    got = guidellm_peer.load_report(path)
    assert [r.start_s for r in got] == [1.0, 2.0]
    assert got[0].status == "successful"
    assert got[0].iterations == 66
    assert got[0].output_tokens == 64


def test_missing_install_is_reported(tmp_path: Path) -> None:
    assert guidellm_peer.find(tmp_path / "nowhere") is None
    line = guidellm_peer.not_installed_line(guidellm_peer.DEFAULT_VENV)
    assert line == "guidellm: not installed (pip install guidellm==0.8.1 into /tmp/guidellm-venv)"
