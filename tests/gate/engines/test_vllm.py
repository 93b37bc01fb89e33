"""Whole gates between real vLLM servers (issue 29): vLLM's CPU build from the test bed that
`bench/vllm/setup` (`make vllm`) builds in `.vllm/` (or `$GATE_VLLM_HOME`), serving tiny models
made there. `.ci/run` builds it; with CI=true a missing test bed fails these tests, elsewhere
they skip.

The launch is the vllm preset's module form (gate/engines/presets.py): `python -m
vllm.entrypoints.openai.api_server`, as the CPU build's `vllm` console script does not run.
Rates are sized to two vLLM servers and the gate on two cores (`--enforce-eager`: compiling on
CPU stalls an engine for seconds in its first minute of load, examples/specs/vllm-cpu.yaml).

They run after the rest of the suite, on their own (Makefile: `-m vllm`), because six vLLM
processes and a parallel test run on two cores starve each other and the gate then judges the
machine, not the engines.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gaterun import wait_for
from services import service_missing

from gate.core.settings import Settings
from gate.runs.runner import run_gate
from gate.spec import parse_spec

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[3]
HOME = Path(os.environ.get("GATE_VLLM_HOME", ROOT / ".vllm"))
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
STEADY = {"name": "steady", "rate": 8, "requests": 320, "prompt_tokens": 32, "max_tokens": 32}


@dataclass(frozen=True)
class Bed:
    python: Path
    models: Path


@pytest.fixture(scope="module")
def bed() -> Bed:
    check = subprocess.run(
        [str(ROOT / "bench" / "vllm" / "setup"), "--check"],
        env={**os.environ, "GATE_VLLM_HOME": str(HOME)},
        capture_output=True,
        check=False,
    )
    if check.returncode != 0:
        service_missing("the real-vLLM test bed", f"bench/vllm/setup --check failed for {HOME}")
    return Bed(HOME / "venv" / "bin" / "python", HOME / "models")


def engine(bed: Bed, *args: str, model: str = "tiny-a", tag: str = "") -> dict[str, Any]:
    return {
        "preset": "vllm",
        "python": str(bed.python),
        "args": [*ARGS, "--model", str(bed.models / model), *args],
        "env": {**CPU_ENV, "LLM_GATE_TEST_TAG": tag},
        "readiness_timeout_s": 600,
    }


def run(
    tmp_path: Path, reference: dict[str, Any], candidate: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    parsed = parse_spec(
        {
            "name": "vllm",
            "model": "tiny",
            "reference": reference,
            "candidate": candidate,
            "scenarios": [STEADY],
            **spec,
        }
    )
    out = asyncio.run(
        run_gate(
            parsed,
            Settings(data_dir=tmp_path / ".gate"),
            report_dir=tmp_path / "reports",
            db_url=f"sqlite:///{tmp_path / 'g.db'}",
        )
    )
    return dict(out.document)


def decisions(doc: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["decision"] for c in doc["checks"]}


def test_identical_vllm_servers_continue_and_say_where_startup_went(
    bed: Bed, tmp_path: Path
) -> None:
    doc = run(tmp_path, engine(bed, "--max-num-seqs", "8"), engine(bed, "--max-num-seqs", "8"))
    assert doc["verdict"] == "continue", (doc["summary"], doc["reasons"])
    checks = decisions(doc)
    assert checks["steady.ttft.p50"] != "fail" and checks["steady.itl.p50"] != "fail"
    assert checks["correctness.greedy.flips"] == "pass"  # same weights, same greedy tokens
    for role in ("reference", "candidate"):
        phases = doc["engines"][role]["phases"]
        # vLLM's own startup steps, read from its log (gate/engines/logphases.py), in order
        steps = ["config_resolved", "weights_loaded", "kv_cache_sized", "api_up", "ready"]
        assert all(s in phases for s in steps), sorted(phases)
        assert [phases[s] for s in steps] == sorted(phases[s] for s in steps)


def test_one_sequence_slot_against_eight_holds_naming_ttft(bed: Bed, tmp_path: Path) -> None:
    """`--max-num-seqs 1` serves one request at a time: at 8/s with 32 tokens each (about 0.15 s
    a request alone) requests queue behind each other, and the TTFT the candidate's users wait
    grows several-fold while the eight-slot reference batches them."""
    doc = run(
        tmp_path,
        engine(bed, "--max-num-seqs", "8"),
        engine(bed, "--max-num-seqs", "1"),
        correctness="off",
    )
    assert doc["verdict"] == "hold"
    held = {r["check"] for r in doc["reasons"]}
    assert any(c.startswith("steady.ttft.") or c == "steady.saturation.candidate" for c in held)
    assert "gate.environment" not in held  # the reference kept up


def test_other_weights_hold_on_divergence(bed: Bed, tmp_path: Path) -> None:
    """The same server with another seed's weights: every greedy answer differs."""
    doc = run(
        tmp_path,
        engine(bed, "--max-num-seqs", "8"),
        engine(bed, "--max-num-seqs", "8", model="tiny-b"),
        scenarios=[{"suite": "correctness"}],
    )
    assert doc["verdict"] == "hold"
    held = {r["check"] for r in doc["reasons"]}
    assert any(c.startswith("correctness.") for c in held), held


def tagged(tag: str) -> list[int]:
    """Processes whose environment carries the test's tag: every vLLM process (the API server,
    its EngineCore and its worker inherit the engine's environment)."""
    found = []
    needle = f"LLM_GATE_TEST_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                status = (entry / "status").read_text()
                if "State:\tZ" not in status:
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_sigkill_of_gate_run_leaves_no_vllm_process(bed: Bed, tmp_path: Path) -> None:
    """`kill -9` of `gate run` once both vLLM servers run their three processes each: none of
    the six outlives it (the keeper's parent-death signal ends each engine's tree)."""
    tag = uuid.uuid4().hex
    spec = tmp_path / "spec.yaml"
    import json

    eng = engine(bed, "--max-num-seqs", "8", tag=tag)
    spec.write_text(
        f"name: vllm-sigkill\nmodel: tiny\nreference: {json.dumps(eng)}\n"
        f"candidate: {json.dumps(eng)}\nscenarios: [{json.dumps(STEADY)}]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env["GATE_DATA_DIR"] = str(tmp_path / ".gate")
    gate = subprocess.Popen(
        [sys.executable, "-m", "gate", "run", str(spec)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # API server, EngineCore and worker of both engines
        seen = wait_for(lambda: len(tagged(tag)) >= 6 and tagged(tag), 300, "six vLLM processes")
        gate.send_signal(signal.SIGKILL)
        assert gate.wait(timeout=30) == -signal.SIGKILL
        started = time.monotonic()
        wait_for(lambda: tagged(tag) == [], 60, "every vLLM process to end")
        assert time.monotonic() - started < 60
        assert len(seen) >= 6
    finally:
        if gate.poll() is None:
            gate.kill()
        for pid in tagged(tag):  # never leave a server behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
