from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
from report_records import streamed_records
from verdicts import CONTINUE_LINE, HOLD_LINE, mixed_document, old_document

from gate.analysis.samples import columns_from_records
from gate.reports.charts import (
    Line,
    cdf_chart,
    error_timeline,
    interval_glyph,
    line_chart,
    scatter_chart,
    timeline_chart,
)
from gate.reports.html import render_report, write_report
from gate.verdict import VerdictDocument

EVIL = "<script>alert('x')</script>"
NS = "{http://www.w3.org/2000/svg}"


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
            "reference": columns_from_records(streamed_records(50, 40, EVIL), 0),
            "candidate": columns_from_records(streamed_records(50, 60, EVIL), 0),
        }
    }
    html = render_report(VerdictDocument.read(_doc()), cols, warmup=5)
    assert EVIL not in html
    assert "&lt;script&gt;alert(" in html
    assert html.count("<svg") >= 4  # TTFT CDF, ITL CDF, TTFT over time, lifecycle
    assert "HOLD" in html and "steady.ttft.p50" in html
    assert "http://" not in html.replace("http://127.0.0.1", "").replace("http://www.w3.org", "")
    out = tmp_path / "r.html"
    write_report(VerdictDocument.read(_doc()), cols, out)
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


def _svgs(html: str) -> list[ElementTree.Element]:
    return [ElementTree.fromstring(m) for m in re.findall(r"<svg .*?</svg>", html, flags=re.S)]


def test_every_chart_is_well_formed_and_labelled() -> None:
    rng = np.random.default_rng(1)
    x = np.linspace(0.5, 9.5, 10)
    charts = [
        # A long tail: the x axis goes logarithmic.
        cdf_chart(
            {"reference": rng.lognormal(3, 0.8, 500), "candidate": rng.lognormal(3.3, 0.8, 500)},
            "tail",
            "ms",
        ),
        line_chart(
            [
                Line("sent", "#888", x, np.full(10, 20.0), dash=True),
                Line("reference", "#36a", x, x),
            ],
            "rates",
            "s",
            "requests/s",
            [("warm", 0.0), ("hot <b>", 5.0)],
            kind="throughput",
        ),
        error_timeline(
            {
                "reference": (np.array([]), []),
                "candidate": (np.array([1.0, 1.0, 2.5]), ["http_5xx", "http_5xx", "timeout"]),
            },
            10.0,
            "errors",
            [("hot", 5.0)],
        ),
        error_timeline({"reference": (np.array([]), []), "candidate": (np.array([]), [])}, 3, "e"),
        timeline_chart(
            {
                "reference": {"launched": 0.0, "port_open": 0.5, "ready": 1.0},
                "candidate": {"launched": 0.0, "port_open": 0.7, "crashed": 1.5},
            },
            "lifecycle",
        ),
    ]
    for svg in charts:
        root = ElementTree.fromstring(svg)
        assert root.get("role") == "img" and root.get("aria-label") and root.get("data-chart")
        assert root.find(f"{NS}title") is not None
    assert "(log scale)" in charts[0] and "p99" in charts[0]
    assert "hot &lt;b&gt;" in charts[1] and 'stroke-dasharray="6 4"' in charts[1]
    assert "candidate: 3 failed (http_5xx 2, timeout 1)" in charts[2]
    assert "no request failed on either engine" in charts[3]
    assert "candidate crashed at 1.500 s" in charts[4]
    glyph = interval_glyph(1.4, (1.3, 1.5), 1.05, (0.9, 1.6), "fail")
    assert ElementTree.fromstring(glyph).get("aria-label") == (
        "ratio 1.400x, interval 1.300x to 1.500x, threshold 1.050x"
    )


def test_report_of_a_gate_that_could_not_finish() -> None:
    doc = {
        "gate_id": "g1",
        "name": "lost",
        "state": "error",
        "verdict": "hold",
        "reasons": [{"check": "gate.worker_lost", "message": "the worker stopped <b>"}],
        "checks": [],
        "notes": ["The gate could not finish, so it cannot vouch for the candidate: hold."],
        "error": {"code": "worker_lost", "message": "the worker stopped <b>"},
        "finished_at": "2026-11-30T00:00:00+00:00",
        "exit_code": 2,
    }
    html = render_report(VerdictDocument.read(doc), {})
    assert "could not finish" in html and "the worker stopped &lt;b&gt;" in html
    assert "<svg" not in html and "Checks" not in html


def test_units_divergence_examples_and_no_script() -> None:
    doc = _doc()
    doc["checks"] += [
        {
            "id": "steady.errors",
            "group": "errors",
            "decision": "pass",
            "reference": 0.002,
            "candidate": 0.004,
            "threshold": 0.01,
            "samples": [50, 50],
            "message": "e",
        },
        {
            "id": "startup.ready",
            "group": "startup",
            "metric": "ready_s",
            "decision": "pass",
            "reference": 1.5,
            "candidate": 1.6,
            "ratio": 1.07,
            "threshold": 4.0,
            "samples": [1, 1],
            "message": "s",
        },
        {
            "id": "o.overload",
            "group": "overload",
            "metric": "collapse",
            "decision": "undecided",
            "reference": 0.0,
            "candidate": 0.01,
            "interval": [-0.066, 0.066],
            "threshold": 0.02,
            "samples": [90, 90],
            "message": "o",
        },
    ]
    doc["divergence_examples"] = [
        {
            "prompt": "2+2=",
            "reference_tokens": ["17", "18", "19"],
            "candidate_tokens": ["17", "20"],
            "index": 1,
            "margin": 0.0123,
            "outside_top_k": True,
            "scenario": "correctness",
        }
    ]
    doc["correctness"] = [
        {
            "name": "correctness",
            "probes": 8,
            "answered": {"reference": 8, "candidate": 8},
            "exact_matches": 7,
            "envelope_exact_matches": 8,
            "teacher_forced": 8,
            "failures": [{"engine": "candidate", "message": EVIL}],
        }
    ]
    html = render_report(VerdictDocument.read(doc), {})
    assert "0.20%" in html and "0.40%" in html and "1.00%" in html  # error fractions
    assert "1.50 s" in html and "4.00 s" in html  # startup seconds
    assert "-6.6 to +6.6 pts" in html and "2.0 pts" in html  # collapse difference
    assert '<mark class="tok div" title="first divergence (token 1)">20</mark>' in html
    assert "margin <strong>0.0123</strong>" in html and "outside the reference" in html
    assert "<script" not in html and EVIL not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    plain = render_report(VerdictDocument.read(_doc()), {})
    assert 'id="divergence-heading"' not in plain  # absent examples: no section


def test_a_scenario_that_ended_at_its_plan_is_not_called_stopped_early() -> None:
    doc = _doc()
    early = {"reason": "planned", "requests": 792, "planned": 792, "upto": 800, "checks": []}
    doc["scenarios"][0] |= {
        "planned_requests": 792,
        "early_stop": early | {"message": "steady ended at its planned 792 requests per arm"},
    }
    html = render_report(VerdictDocument.read(doc), {})
    assert "<strong>ended</strong> (planned 792 requests): steady ended at its planned" in html
    assert "stopped early" not in html
    doc["scenarios"][0]["early_stop"] = early | {"reason": "hold", "message": "held at 500"}
    assert "<strong>stopped early</strong>" in render_report(VerdictDocument.read(doc), {})


def test_the_plan_line_says_what_the_plan_could_detect_and_what_the_verdict_cost() -> None:
    doc = _doc()
    note = (
        "steady: 792 planned requests per engine in 24 blocks of 32; with 80% power it can "
        "detect TTFT p50 +13%, TTFT p90 +22% (assuming a pair's log ratio has sd 0.3; the "
        "checks measure it)."
    )
    doc["notes"] = ["Latency budget 0.015 planned over 4 paired quantile checks.", note]
    early = {"reason": "hold", "requests": 500, "planned": 792, "upto": 508, "checks": []}
    doc["scenarios"][0] |= {"planned_requests": 792, "early_stop": early | {"message": "held"}}
    html = render_report(VerdictDocument.read(doc), {})
    line = html.split('<p class="scenario-plan">')[1].split("</p>")[0]
    assert "can detect TTFT p50 +13%, TTFT p90 +22%" in line
    assert "The verdict cost <strong>500 requests per engine</strong>" in line
    assert "Latency budget" not in line
    doc["notes"] = []
    assert 'class="scenario-plan"' not in render_report(VerdictDocument.read(doc), {})


def test_the_headline_counts_undecided_checks_that_do_not_hold_apart() -> None:
    doc = _doc()
    undecided = {
        "id": "steady.ttft.p90",
        "decision": "undecided",
        "required": False,
        "threshold": 1.1,
        "samples": [500, 500],
        "message": "undecided: could detect p90 >= +14%",
    }
    passed = doc["checks"][0] | {"decision": "pass"}
    doc |= {"verdict": "continue", "reasons": [], "checks": [passed, undecided]}
    html = render_report(VerdictDocument.read(doc), {})
    assert "1 of 2 checks passed and no regression was shown (1 undecided" in html
    assert "All 2 checks passed" not in html
    doc |= {"verdict": "hold", "checks": [passed, undecided | {"required": True}]}
    doc["reasons"] = [{"check": "steady.ttft.p90", "message": "undecided"}]
    assert "1 required could not be decided" in render_report(VerdictDocument.read(doc), {})


def test_the_verdict_cost_without_an_early_stop_is_what_both_engines_sent() -> None:
    doc = _doc()
    doc["notes"] = ["steady: 792 planned requests per engine in 24 blocks of 32; can detect."]
    doc["scenarios"][0]["planned_requests"] = 792
    html = render_report(VerdictDocument.read(doc), {}, warmup=5)
    assert "The verdict cost <strong>45 requests per engine</strong>" in html  # 50 sent - 5


def _summary_cells(html: str) -> dict[str, list[str]]:
    """Each engine's row of the scenario's summary table, as cell texts."""
    table = html.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    rows: dict[str, list[str]] = {}
    for row in re.findall(r"<tr><td>.*?</tr>", table, flags=re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        rows[cells[0]] = cells[1:]
    return rows


def test_resent_requests_have_a_column_and_a_line_and_are_no_errors() -> None:
    doc = _doc()
    summary = doc["scenarios"][0]["reference"]
    doc["scenarios"][0]["reference"] = summary | {
        "requests": {"sent": 50, "ok": 50, "errors": 0, "resent": 0}
    }
    doc["scenarios"][0]["candidate"] = summary | {
        "requests": {"sent": 50, "ok": 50, "errors": 0, "resent": 3}
    }
    html = render_report(VerdictDocument.read(doc), {})
    assert ">sent again</th>" in html
    cells = _summary_cells(html)
    assert cells["reference"][-2:] == ["none", "0"]  # errors, sent again
    assert cells["candidate"][-2:] == ["none", "3"]
    assert "Sent again on a fresh connection: 3 to the candidate." in html
    assert "not engine errors" in html


def test_a_document_from_before_resent_counts_shows_a_dash_and_no_line() -> None:
    html = render_report(VerdictDocument.read(_doc()), {})
    cells = _summary_cells(html)
    assert cells["reference"][-1] == "–" and cells["candidate"][-1] == "–"
    assert "Sent again on a fresh connection" not in html


def test_the_divergence_view_shows_each_probe_the_deltas_and_the_mirrored_outputs() -> None:
    """Issue 18, part 6: per probe where it parts, both tokens with their logprobs and the
    margin; the |delta logprob| distribution against the envelope and the floor; the load
    scenarios' mirrored outputs with an example."""
    doc = _doc()
    doc["correctness"] = [
        {
            "name": "correctness",
            "probes": 2,
            "answered": {"reference": 2, "candidate": 2},
            "exact_matches": 1,
            "envelope_exact_matches": 2,
            "teacher_forced": 2,
            "probe_divergence": [
                {"probe": 0, "first": None, "length": 32},
                {
                    "probe": 1,
                    "first": 5,
                    "length": 32,
                    "reference_token": " pazon",
                    "reference_logprob": -0.1234,
                    "candidate_token": EVIL,
                    "candidate_logprob": -0.2468,
                    "reference_logprob_of_candidate": -0.9,
                    "margin": 0.7766,
                },
            ],
            "abs_delta_logprob": {
                "candidate": [0.01, 0.2, 0.5, 0.03],
                "envelope": [0.02, 0.02, 0.02, 0.02],
                "floor_nat": 0.05,
                "envelope_tolerance": 0.5,
            },
        }
    ]
    doc["scenarios"][0]["outputs"] = {
        "compared": 300,
        "exact": 10,
        "early": 280,
        "early_tokens": 16,
        "basis": "text",
        "histogram": [200, 80, 10] + [0] * 61,
        "examples": [{"request_id": 3, "position": 0, "reference": "abc", "candidate": EVIL}],
        "blocks": [[16, 15]] * 18,
    }
    html = render_report(VerdictDocument.read(doc), {})
    assert "identical (32 tokens)" in html and "token 5 of 32" in html
    assert "<code> pazon</code> (-0.1234)" in html and "-0.2468 · -0.9000" in html
    assert "0.7766" in html
    chart = re.search(r'<svg[^>]*aria-label="Teacher-forced \|delta logprob\|[^"]*"', html)
    assert chart is not None and "floor 0.05" in chart.group(0)
    # the envelope's p99 (0.02 x 1.5) plus the floor is marked where the deltas are judged
    assert "envelope p99 x1.5 + floor 0.08 (a guide)" in html
    assert "Mirrored load outputs" in html and "280 (before token 16)" in html
    assert "token 0" in html and "request 3" in html
    assert "<script" not in html and EVIL not in html


def test_each_engine_card_lists_what_it_supports() -> None:
    doc = _doc()
    caps = {
        "completions": True,
        "chat": True,
        "logprobs": True,
        "top_logprobs_max": 5,
        "prompt_logprobs": False,
        "token_ids": True,
        "prompt_token_ids": False,
        "stream_usage": True,
        "problems": ["prompt_logprobs: the answer has no prompt_logprobs"],
    }
    for role in doc["engines"]:
        doc["engines"][role]["capabilities"] = caps
    html = render_report(VerdictDocument.read(doc), {})
    assert len(doc["engines"]) == 2 and html.count("✓ logprobs (top 5)") == 2
    assert "✗ prompt logprobs" in html and "✓ usage in streams" in html


def _heading(html: str) -> str:
    """The verdict word, as the banner's heading reads."""
    h2 = html.split('<h2 id="verdict-heading" class="word">', 1)[1].split("</h2>", 1)[0]
    return re.sub(r"<[^>]+>", "", h2)


def _banner(html: str) -> str:
    """The verdict banner's markup, tags stripped to single-spaced text."""
    section = html.split('<section class="banner', 1)[1].split("</section>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", " ", section.split(">", 1)[1]).split())


def test_a_continue_banner_lists_warnings_and_what_was_not_shown() -> None:
    """Issue 28: the banner said 'Every check passed ... within tolerance' beside undecided
    checks. Now it says 'continue, with N warnings' and lists both."""
    html = render_report(mixed_document(hold=False), {})
    assert '<section class="banner continue warned"' in html
    banner = _banner(html)
    assert _heading(html) == "CONTINUE, with 2 warnings"
    assert "3 of 4 checks passed and no regression was shown (1 undecided" in banner
    assert CONTINUE_LINE in banner  # the summary line, as every surface says it
    assert "every check passed" not in banner.lower()
    warnings = html.split('<ul class="warnings"', 1)[1].split("</ul>", 1)[0]
    assert warnings.count("<li>") == 2
    assert 'href="#check-steady.errors"' in warnings and "not with confidence at 292" in warnings
    shown = html.split('<ul class="not-shown"', 1)[1].split("</ul>", 1)[0]
    assert 'href="#check-steady.ttft.p90"' in shown
    assert "TTFT p90 in steady within +10% (shown: at most +14%)" in shown
    assert "<title>CONTINUE, with 2 warnings · mixed · deploy gate</title>" in html
    # each warned check's row says so; the undecided one is marked not required
    row = html.split('id="check-steady.errors"', 1)[1].split("</tr>", 2)
    assert 'class="pill warning"' in row[0] and "<strong>Warning:</strong>" in row[1]
    undecided = html.split('id="check-steady.ttft.p90"', 1)[1].split("</tr>", 1)[0]
    assert "not required" in undecided


def test_a_hold_banner_lists_reasons_and_warnings_not_what_was_not_shown() -> None:
    html = render_report(mixed_document(hold=True), {})
    banner = _banner(html)
    assert _heading(html) == "HOLD"
    assert HOLD_LINE in banner
    assert "steady.ttft.p50 : TTFT p50 in steady is 1.43x" in banner
    assert "2 warnings" in banner and 'class="not-shown"' not in html
    assert "every check passed" not in banner.lower()


def test_every_check_passed_only_when_every_check_did() -> None:
    doc = _doc()
    doc |= {
        "verdict": "continue",
        "reasons": [],
        "checks": [doc["checks"][0] | {"decision": "pass"}],
    }
    banner = _banner(render_report(VerdictDocument.read(doc), {}))
    assert "Every check passed" in banner and "All 1 checks passed" in banner
    warned = doc["checks"][0] | {"warning": "past its warning threshold"}
    doc["checks"] = [warned]
    html = render_report(VerdictDocument.read(doc), {})
    banner = _banner(html)
    assert _heading(html) == "CONTINUE, with 1 warning"
    assert "Every check passed" not in banner and "past its warning threshold" in banner


def test_an_old_document_renders_undecided_and_what_was_not_shown() -> None:
    html = render_report(VerdictDocument.read(old_document()), {})
    assert "inconclusive" not in html.split("<details><summary>The verdict document", 1)[0]
    banner = _banner(html)
    assert _heading(html) == "CONTINUE"
    assert "TTFT p90 in steady within +10% (shown: at most +14%)" in banner
    assert "every check passed" not in banner.lower()
