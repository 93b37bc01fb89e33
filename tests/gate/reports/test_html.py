from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from gate.reports.charts import cdf_chart, scatter_chart, timeline_chart
from gate.reports.html import render_report, write_report
from gate.runs.samples import columns_from_records
from loadgen.records import RequestRecord

EVIL = "<script>alert('x')</script>"


def _records(n: int, ttft_ms: float) -> list[RequestRecord]:
    out = []
    for i in range(n):
        sent = i * 10_000_000
        first = sent + int(ttft_ms * 1e6 * (1 + 0.01 * (i % 7)))
        chunks = [first + j * 12_000_000 for j in range(8)]
        out.append(
            RequestRecord(
                i, "x", sent, sent, first, chunks[-1], 200, None, None, 8, 16, chunks, [1] * 8, EVIL
            )
        )
    return out


def _doc() -> dict:  # type: ignore[type-arg]
    summary = {
        "requests": {"sent": 50, "ok": 50, "errors": 0},
        "errors_by_kind": {},
        "ttft_ms": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0},
        "itl_ms": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0},
        "e2e_ms": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0},
        "throughput": {"requests_per_s": 1.0, "output_tokens_per_s": 8.0},
    }
    return {
        "gate_id": "abc",
        "name": "t",
        "model": "m",
        "state": "complete",
        "verdict": "hold",
        "reasons": [{"check": "steady.ttft.p50", "message": f"slower {EVIL}"}],
        "checks": [
            {
                "id": "steady.ttft.p50",
                "decision": "fail",
                "reference": 40.0,
                "candidate": 60.0,
                "ratio": 1.5,
                "interval": [1.4, 1.6],
                "threshold": 1.05,
                "samples": [50, 50],
                "message": "TTFT is 1.5x",
            }
        ],
        "notes": [],
        "report": "r.html",
        "document": "r.json",
        "duration_s": 3.0,
        "started_at": "2026-11-30T00:00:00+00:00",
        "engines": {
            "reference": {
                "kind": "process",
                "url": "http://127.0.0.1:1",
                "phases": {"launched": 0.1, "ready": 1.0},
                "ready_s": 0.9,
                "crash": None,
                "log_tail": [EVIL],
                "placement": None,
            },
            "candidate": {
                "kind": "endpoint",
                "url": "http://127.0.0.1:2",
                "phases": {"attached": 0.1},
                "ready_s": None,
                "crash": None,
                "log_tail": [],
                "placement": None,
            },
        },
        "scenarios": [
            {
                "name": "steady",
                "duration_s": 2.0,
                "aborted": False,
                "reference": summary,
                "candidate": summary,
            }
        ],
    }


def test_report_escapes_engine_output_and_has_charts(tmp_path: Path) -> None:
    cols = {
        "steady": {
            "reference": columns_from_records(_records(50, 40), 0),
            "candidate": columns_from_records(_records(50, 60), 0),
        }
    }
    html = render_report(_doc(), cols, warmup=5)
    assert EVIL not in html
    assert "&lt;script&gt;alert(" in html
    assert html.count("<svg") >= 4  # TTFT CDF, ITL CDF, TTFT over time, lifecycle
    assert "HOLD" in html and "steady.ttft.p50" in html
    assert "http://" not in html.replace("http://127.0.0.1", "").replace("http://www.w3.org", "")
    out = tmp_path / "r.html"
    write_report(_doc(), cols, out)
    assert out.read_text() and out.with_suffix(".json").is_file()


def test_charts_are_well_formed_svg() -> None:
    rng = np.random.default_rng(0)
    svgs = [
        cdf_chart(
            {"reference": rng.lognormal(3, 0.1, 300), "candidate": rng.lognormal(3.4, 0.1, 300)},
            "t <&>",
            "ms",
        ),
        scatter_chart({"reference": (np.arange(10.0), np.ones(10))}, "s", "x", "y"),
        timeline_chart({"reference": {"launched": 0.0, "healthy": 1.0, "ready": 2.0}}, "tl"),
        cdf_chart({"reference": np.array([])}, "empty", "ms"),
    ]
    for svg in svgs:
        ElementTree.fromstring(svg)  # raises on malformed XML
    assert "t &lt;&amp;&gt;" in svgs[0]
