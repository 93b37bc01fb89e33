"""Whole gates on sim engines whose load comes from a workload (gate/runs/workloads.py): a
Mooncake-layout trace replayed at its recorded instants, and a mix of multi-turn sessions,
shared prefixes, long contexts, ShareGPT conversations and logged OpenAI requests. Real sim
processes over real HTTP, the real runner and a real SQLite file; a few seconds of load each.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gate.core.database import open_migrated
from gate.core.limits import Limits
from gate.core.settings import Settings
from gate.runs.runner import run_gate
from gate.runs.schedules import Schedule, plan_gate
from gate.runs.workloads import WorkloadFiles
from gate.service.service import sample_columns
from gate.spec import parse_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "workloads"
SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}", "--profile", "tiny"]
POLICY = {
    "extend": 0,
    "warmup_requests": 0,
    # a few seconds of load cannot make the 8 time blocks the latency checks need: these
    # gates are about what was sent, their latency left undecided and said so
    "short_scenarios": "allow",
}


def run(tmp_path: Path, scenario: dict[str, Any]) -> tuple[dict[str, Any], Any, Schedule]:
    """An A/A gate of one scenario, its document, its stored columns, and its schedule as
    the gate built it (the same spec and seed build the same one)."""
    spec = parse_spec(
        {
            "name": "workloads",
            "model": "demo-model",
            "reference": {"command": SIM},
            "candidate": {"command": SIM},
            "scenarios": [scenario],
            "policy": POLICY,
            "correctness": "off",
        }
    )
    db = f"sqlite:///{tmp_path / 'g.db'}"
    settings = Settings(data_dir=tmp_path / ".gate", workload_dir=EXAMPLES)
    out = asyncio.run(run_gate(spec, settings, report_dir=tmp_path / "reports", db_url=db))
    columns = sample_columns(open_migrated(db), out.gate_id)[scenario["name"]]
    files = WorkloadFiles(EXAMPLES, confined=True)
    schedule = plan_gate(spec, Limits(), files).schedules[scenario["name"]]
    return dict(out.document), columns, schedule


def test_a_trace_replays_at_its_recorded_instants(tmp_path: Path) -> None:
    """The first 2.5 s of the example trace: each request leaves both engines at its recorded
    instant (its timestamp less the first, in ms), and the report describes the trace."""
    records = [json.loads(line) for line in (EXAMPLES / "mooncake-trace.jsonl").open()]
    stamps = np.array([r["timestamp"] for r in records], np.float64) / 1000.0
    offsets = stamps - stamps[0]
    kept = offsets[offsets < 2.5]
    scenario = {
        "name": "replay",
        "duration_s": 2.5,
        "workload": {"kind": "trace", "file": "mooncake-trace.jsonl"},
    }
    doc, columns, _ = run(tmp_path, scenario)

    assert doc["verdict"] == "continue", (doc["summary"], doc["reasons"])
    sc = doc["scenarios"][0]
    work = sc["workload"]
    assert work["replay"] == "recorded" and work["requests"] == kept.size
    lengths = [r["input_length"] for r in records[: kept.size]]
    assert work["prompt_tokens"]["max"] == max(lengths)
    assert work["prompt_tokens"]["min"] == min(lengths)
    assert sum(work["arrivals"]) == kept.size
    for role in ("reference", "candidate"):
        cols = columns[role]
        assert len(cols) == kept.size and bool(cols.ok.all())
        intended_s = np.sort(cols.intended_ns) / 1e9
        assert np.allclose(intended_s - intended_s[0], kept, atol=1e-6)
        # ... and sent then: within 20 ms on a busy two-core machine
        late_s = (cols.sent_ns - cols.intended_ns) / 1e9
        assert float(np.median(late_s)) < 0.02, late_s
    html = (tmp_path / "reports").glob("*.html")
    text = next(iter(html)).read_text()
    assert "Workload" in text and "prompt tokens" in text and "arrivals" in text


def test_sessions_and_a_mix_on_the_sim(tmp_path: Path) -> None:
    """Multi-turn sessions beside shared prefixes, long prompts and both kinds of file: each
    later turn leaves after that engine's own answer plus the think time; the document says
    the contexts differ after the first turn and compares the mirrored outputs of first turns
    and lone requests only."""
    scenario = {
        "name": "chat",
        "api": "chat",
        "rate": 40,
        "requests": 80,
        "max_tokens": 8,
        "workload": {
            "mix": [
                {"kind": "sessions", "share": 3, "turns": 3, "think_s": 0.2, "prompt_tokens": 16},
                {"kind": "shared_prefix", "groups": 2, "prefix_tokens": 64, "prompt_tokens": 8},
                {"kind": "long_context", "share": 0.5, "prompt_tokens": 2000},
                {"kind": "sharegpt", "file": "sharegpt-conversations.jsonl", "think_s": 0.1},
                {"kind": "openai", "file": "openai-requests.jsonl"},
            ]
        },
    }
    doc, columns, schedule = run(tmp_path, scenario)

    sc = doc["scenarios"][0]
    work = sc["workload"]
    assert {p["kind"] for p in work["parts"] if p["requests"]} == {
        "sessions",
        "shared_prefix",
        "long_context",
        "sharegpt",
        "openai",
    }
    assert work["sessions"] > 0 and work["later_turns"] > 0
    assert work["prompt_tokens"]["max"] == 2000
    n = work["requests"]
    assert sc["reference"]["requests"]["ok"] == n and sc["candidate"]["requests"]["ok"] == n
    assert any("contexts differ after the first turn" in note for note in doc["notes"])
    # mirrored outputs: first turns and lone requests only
    assert sc["outputs"]["compared"] == n - work["later_turns"]
    # a later turn left each engine no sooner than its parent's answer there plus think time
    later = [r for r in schedule.requests if r.parent is not None]
    assert len(later) == work["later_turns"]
    for role in ("reference", "candidate"):
        cols = columns[role]
        at = {int(r): i for i, r in enumerate(cols.request_id)}
        assert len(at) == n
        for req in later:
            child, parent = at[req.request_id], at[req.parent]
            earliest = int(cols.end_ns[parent]) + round(req.think_s * 1e9)
            assert int(cols.intended_ns[child]) >= earliest, (role, req.request_id)
            assert int(cols.sent_ns[child]) >= earliest
    checks = {c["id"]: c["decision"] for c in doc["checks"]}
    assert not any(c.startswith("chat.outputs") and d == "fail" for c, d in checks.items()), checks
