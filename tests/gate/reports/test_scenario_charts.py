"""One scenario's charts (gate/reports/scenario_charts.py), from real per-request columns."""

from __future__ import annotations

from xml.etree import ElementTree

from report_records import streamed_records

from gate.analysis.samples import columns_from_records
from gate.reports.scenario_charts import scenario_charts


def test_scenario_charts_with_phases_and_slos() -> None:
    cols = {
        "reference": columns_from_records(streamed_records(60, 40), 0),
        "candidate": columns_from_records(streamed_records(60, 60), 0),
    }
    charts = scenario_charts("peak", cols, 5, [("a", 0.0), ("b", 0.3)], {"ttft_ms": 50.0}, 1.0)
    assert list(charts) == ["ttft_cdf", "itl_cdf", "ttft_time", "itl_time", "throughput", "errors"]
    rates = str(charts["throughput"])
    # With an SLO, goodput (dashed) differs from throughput: the candidate misses TTFT <= 50.
    assert "reference throughput" in rates and "candidate goodput" in rates
    assert "TTFT &lt;= 50 ms" in rates and "candidate: 0 good of 60 sent" in rates
    for svg in charts.values():
        ElementTree.fromstring(str(svg))
