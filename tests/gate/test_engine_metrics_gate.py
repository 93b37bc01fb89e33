"""Whole gates on real sim processes over real HTTP (`gate run`), the engines' metrics sampled
beside the load (gate/telemetry) and judged (gate/analysis/engine_metrics.py):

- A/A: the gate continues with the engine checks present and passing (preemptions, queue
  depth, KV capacity), each engine's timeline and configuration stored in the document;
- a candidate with fewer KV blocks (the sim's --num-gpu-blocks-override, as vLLM's flag) under
  a load that fills them: its scheduler preempts (vllm:num_preemptions_total) and the gate
  holds naming the KV capacity and the preemptions; re-judged from the stored document under a
  policy that tolerates the smaller cache, the preemptions still hold, from the stored series.

Each gate is a 6 s scenario at 60 requests/s (about 15 s of wall time here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.analysis.policy import Policy
from gate.core.database import make_engine, make_sessionmaker
from gate.service.rejudge import rejudge

pytestmark = pytest.mark.slow

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}", "--profile", "tiny"]
# The tiny profile runs 4 sequences at once: 4 x (128 + 32) = 640 tokens at most. 2048 blocks
# of 16 never run out; 34 (544 tokens) admit 4 prompts of 128 and run out as they decode.
ROOMY = ["--max-model-len", "512", "--num-gpu-blocks-override", "2048"]
TIGHT = ["--max-model-len", "512", "--num-gpu-blocks-override", "34"]
BUSY = {
    "name": "busy",
    "arrival": "poisson",
    "rate": 60,
    "requests": 360,
    "prompt_tokens": 128,
    "max_tokens": 32,
    "api": "completions",
}
POLICY = {
    "extend": 0,
    "short_scenarios": "allow",  # 6 s: latency is not what these gates are about
    # scrapes every 0.25 s, blocks of 0.5 s: a 6 s scenario has 12 of them
    "engine": {"preemption_block_s": 0.5},
}


def spec(candidate: list[str]) -> dict[str, Any]:
    return {
        "name": "engine-metrics",
        "model": "demo-model",
        "seed": 3,
        "telemetry": {"interval_s": 0.25},
        "reference": {"command": [*SIM, *ROOMY]},
        "candidate": {"command": [*SIM, *candidate, "--seed", "2"]},
        "correctness": "off",
        "policy": POLICY,
        "scenarios": [BUSY],
    }


def run_gate(tmp_path: Path, body: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(body))
    out = subprocess.run(
        [
            sys.executable, "-m", "gate", "run", str(path), "--json",
            "--db", f"sqlite:///{tmp_path / 'g.db'}", "--report-dir", str(tmp_path / "reports"),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "GATE_DATA_DIR": str(tmp_path / ".gate")},
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-3000:]
    return json.loads(out.stdout)


def test_identical_engines_continue_with_the_engine_checks(tmp_path: Path) -> None:
    doc = run_gate(tmp_path, spec(ROOMY))
    assert doc["verdict"] == "continue", doc["reasons"]
    checks = {c["id"]: c for c in doc["checks"]}
    for cid in ("busy.engine.preemptions", "busy.engine.queue_depth", "engine.kv_capacity"):
        assert checks[cid]["decision"] == "pass", checks[cid]
        assert checks[cid]["group"] == "engine"
    assert checks["engine.kv_capacity"]["ratio"] == 1.0
    tel = doc["scenarios"][0]["telemetry"]
    assert tel["interval_s"] == 0.25
    for role in ("reference", "candidate"):
        eng = tel[role]
        assert eng["config"]["kv_cache_blocks"] == "2048" and eng["config"]["block_size"] == "16"
        assert len(eng["t_s"]) >= 20 and eng["gaps"] == 0
        assert max(eng["series"]["requests_running"]) >= 1  # the load reached it
    report = Path(doc["report"]).read_text()
    assert "KV cache use" in report and "kv_cache_blocks" in report


def test_fewer_kv_blocks_hold_naming_capacity_and_preemptions(tmp_path: Path) -> None:
    doc = run_gate(tmp_path, spec(TIGHT))
    assert doc["verdict"] == "hold"
    reasons = {r["check"] for r in doc["reasons"]}
    assert {"engine.kv_capacity", "busy.engine.preemptions"} <= reasons, doc["reasons"]
    checks = {c["id"]: c for c in doc["checks"]}
    assert "544 tokens" in checks["engine.kv_capacity"]["message"]
    pre = checks["busy.engine.preemptions"]
    assert pre["reference"] == 0 and pre["candidate"] > 10, pre
    series = doc["scenarios"][0]["telemetry"]["candidate"]["series"]["preemptions_total"]
    assert series[-1] - series[0] == pre["candidate"]  # the rise over the scenario
    # Re-judged from the stored document: the smaller cache tolerated, the preemptions remain.
    factory = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'g.db'}"))
    lenient = Policy.model_validate(
        {**POLICY, "engine": {**POLICY["engine"], "kv_capacity_tolerance": 0.99}}
    )
    again = rejudge(factory, doc["gate_id"], lenient)
    by_id = {c.id: c for c in again.checks}
    assert by_id["engine.kv_capacity"].decision == "pass"
    assert by_id["busy.engine.preemptions"].decision == "fail"
