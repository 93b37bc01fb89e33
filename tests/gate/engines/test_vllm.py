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
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gaterun import wait_for
from services import service_missing
from workertools import free_port, start_api

from gate.analysis.policy import Policy
from gate.calibrate_engines import (
    VLLM_ARGS,
    VLLM_CAPACITY_SCENARIO,
    VLLM_ENV,
    VLLM_MAX_TOKENS,
    VLLM_RATE,
    VLLM_REQUESTS,
    vllm_engine,
    vllm_home,
)
from gate.core.database import open_migrated
from gate.core.settings import Settings
from gate.core.vocabulary import ROLES
from gate.runs.runner import run_gate
from gate.service.service import sample_columns
from gate.spec import parse_spec
from gate.verdict.document import CapacityDoc

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[3]
HOME = vllm_home()  # $GATE_VLLM_HOME, default .vllm (the suite runs from the repository root)
STEADY = {
    "name": "steady",
    "rate": VLLM_RATE,
    "requests": VLLM_REQUESTS,
    "prompt_tokens": 32,
    "max_tokens": VLLM_MAX_TOKENS,
}


@pytest.fixture(scope="module")
def bed() -> Path:
    check = subprocess.run(
        [str(ROOT / "bench" / "vllm" / "setup"), "--check"],
        env={**os.environ, "GATE_VLLM_HOME": str(HOME)},
        capture_output=True,
        check=False,
    )
    if check.returncode != 0:
        service_missing("the real-vLLM test bed", f"bench/vllm/setup --check failed for {HOME}")
    return HOME


def engine(bed: Path, *args: str, model: str = "tiny-a", tag: str = "") -> dict[str, Any]:
    return vllm_engine(bed, *args, weights=model, env={"LLM_GATE_TEST_TAG": tag})


def run(
    tmp_path: Path,
    reference: dict[str, Any],
    candidate: dict[str, Any],
    workload_dir: Path | None = None,
    **spec: Any,
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
            Settings(data_dir=tmp_path / ".gate", workload_dir=workload_dir),
            report_dir=tmp_path / "reports",
            db_url=f"sqlite:///{tmp_path / 'g.db'}",
        )
    )
    return dict(out.document)


def decisions(doc: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["decision"] for c in doc["checks"]}


def test_identical_vllm_servers_continue_and_say_where_startup_went(
    bed: Path, tmp_path: Path
) -> None:
    """... and, in the same gate, the workloads of examples/workloads/vllm-cpu.yaml (a trace
    and multi-turn sessions, about 25 s more: check_workloads)."""
    doc = run(
        tmp_path,
        engine(bed, "--max-num-seqs", "8"),
        engine(bed, "--max-num-seqs", "8"),
        workload_dir=ROOT,
        scenarios=[STEADY, *workload_scenarios()],
        # the workload scenarios are too short for the paired latency checks: undecided.
        # Each startup phase gets 6 s of slack, not 2: the servers start one after the other,
        # but beside CI's parallel run (at nice 10, its sims and workers on both cores) the
        # second server's engine_initialized once took 3.6 s against the first's 0.4 s
        # (CI at ec58a07; it passed in the two runs before). That is this host's CPU, not
        # vLLM: the startup rule has no guard for a contended host as capacity has.
        policy={"short_scenarios": "allow", "startup_phase_slack_s": 6.0},
    )
    check_workloads(doc, tmp_path / "g.db")
    assert doc["verdict"] == "continue", (doc["summary"], doc["reasons"])
    checks = decisions(doc)
    assert checks["steady.ttft.p50"] != "fail" and checks["steady.itl.p50"] != "fail"
    assert checks["correctness.greedy.flips"] == "pass"  # same weights, same greedy tokens
    # vLLM's own metrics, scraped beside the load (gate/telemetry): the engine checks are there
    # and pass, each engine's KV cache as its vllm:cache_config_info states it.
    for cid in ("steady.engine.preemptions", "steady.engine.queue_depth", "engine.kv_capacity"):
        assert checks[cid] == "pass", cid
    config = doc["scenarios"][0]["telemetry"]["candidate"]["config"]
    assert int(config["kv_cache_blocks"]) > 0 and config["cache_dtype"] == "auto"
    for role in ("reference", "candidate"):
        phases = doc["engines"][role]["phases"]
        # vLLM's own startup steps, read from its log (gate/engines/logphases.py), in order
        steps = ["config_resolved", "weights_loaded", "kv_cache_sized", "api_up", "ready"]
        assert all(s in phases for s in steps), sorted(phases)
        assert [phases[s] for s in steps] == sorted(phases[s] for s in steps)
    # The test bed (gate/runs/testbed.py): vLLM answers GET /version with {"version":
    # VLLM_VERSION} (vllm/entrypoints/serve/instrumentator/basic.py:53-56 in 0.32.0), the
    # version of the vLLM in the test bed's venv; an A/A gate, as both engines are alike.
    bed_doc = doc["testbed"]
    [written] = (bed / "venv").glob("lib/python*/site-packages/vllm/_version.py")
    found = re.search(r"__version__ = (?:version = )?['\"]([^'\"]+)", written.read_text())
    assert found is not None, written
    vllm_version = found.group(1)
    assert bed_doc["aa"] is True
    for role in ("reference", "candidate"):
        assert bed_doc["engines"][role]["version"] == vllm_version


def test_a_smaller_kv_cache_holds_naming_it(bed: Path, tmp_path: Path) -> None:
    """A candidate with a KV cache of 4 blocks of 32 tokens (`--num-gpu-blocks-override`,
    everything else equal; vLLM keeps one block for itself) under requests of 48 tokens at
    4/s. The gate holds naming the KV capacity the candidate's vllm:cache_config_info states
    (128 tokens against the reference's 1 GiB), and its preemption check is there, judged on
    vllm:num_preemptions_total. At this load the candidate seldom has two requests in flight
    and was not seen to preempt (0 in the run that sized this test); the preemption test's
    power on a cache that does run out is the sim's gate
    (tests/gate/test_engine_metrics_gate.py). Two starts and 8 s of load."""
    small = ("--block-size", "32", "--max-model-len", "96")
    doc = run(
        tmp_path,
        engine(bed, "--max-num-seqs", "8", *small),
        engine(bed, "--max-num-seqs", "8", *small, "--num-gpu-blocks-override", "4"),
        correctness="off",
        telemetry={"interval_s": 0.5},
        policy={"extend": 0, "short_scenarios": "allow", "engine": {"preemption_block_s": 1.0}},
        scenarios=[{**STEADY, "rate": 4.0, "requests": 32}],
    )
    assert doc["verdict"] == "hold", doc["summary"]
    reasons = {r["check"] for r in doc["reasons"]}
    assert "engine.kv_capacity" in reasons, doc["reasons"]
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["engine.kv_capacity"]["candidate"] == 128  # 4 blocks of 32 tokens
    assert checks["engine.kv_capacity"]["reference"] > 1_000
    pre = checks["steady.engine.preemptions"]
    assert pre["reference"] == 0 and pre["candidate"] is not None


# `gate calibrate --engines vllm`'s search with 2 s steps to 25%: what check_capacity asserts
# (the knees found and read as contended, or judged) needs the knees, not their precision, and
# the calibration's 4 s steps to 10% took about 70 s of CI's slowest tier.
CAPACITY = {**VLLM_CAPACITY_SCENARIO, "step_s": 2, "resolution": 0.25}


def test_one_sequence_slot_against_eight_is_never_shown_within_tolerance(
    bed: Path, tmp_path: Path
) -> None:
    """`--max-num-seqs 1` serves one request at a time: at 2/s of 16-token answers its slot is
    busy about a third of the time (this test sends 4/s) and requests that arrive together
    queue, so the TTFT its users wait grows (measured: p50 1.3-1.7x, p90 1.7-2.5x the
    eight-slot reference's). On this test bed (two vLLM servers and the gate on two cores,
    which stall each other in turn; and on a CPU a step's cost grows with its batch, so eight
    slots buy little: docs/calibration.md) the eight blocks of one scenario do not show it
    with confidence: the gate holds on the warm-up it ran through (8 requests at once,
    serialised) or continues with TTFT warnings. What it must never do is claim the
    candidate's TTFT within tolerance, or
    continue without saying so.

    The same candidate also runs with `--no-enable-prefix-caching` (folded in here to save two
    starts): a shared-prefix workload after the steady scenario (16 requests, 8 s, two
    system prompts of 96 words: about 225 of the tiny models' tokens, whole 16-token blocks)
    shows the reference's prefix-cache hits in vllm:prefix_cache_hits_total, and the candidate,
    whose counters never move (vLLM records no lookup with caching off:
    vllm/v1/core/kv_cache_manager.py get_computed_blocks returns before
    record_prefix_cache_stats), holds on the prefix-cache check, its cache_config_info saying
    enable_prefix_caching False. Caching plays no part in steady: its prompts share nothing.

    Then a shorter capacity search than `gate calibrate --engines vllm`'s (CAPACITY: about
    30 s more, check_capacity)."""
    shared = {
        "name": "shared",
        "rate": 2.0,
        "requests": 16,
        "max_tokens": 4,
        "workload": {"kind": "shared_prefix", "groups": 2, "prefix_tokens": 96, "prompt_tokens": 8},
    }
    doc = run(
        tmp_path,
        engine(bed, "--max-num-seqs", "8"),
        engine(bed, "--max-num-seqs", "1", "--no-enable-prefix-caching"),
        correctness="off",
        telemetry={"interval_s": 0.5},
        policy={"short_scenarios": "allow"},  # shared's 8 s: its latency undecided
        # twice the A/A's rate: half its wall time, and the one slot busier (a saturated test
        # bed holds on gate.environment, which this test accepts: it never claims a pass)
        scenarios=[{**STEADY, "rate": 2 * VLLM_RATE}, shared, CAPACITY],
    )
    checks = decisions(doc)
    for q in ("p90", "tail"):
        assert checks[f"steady.ttft.{q}"] != "pass", checks
    if doc["verdict"] == "continue":
        said = {w["check"] for w in doc["warnings"]} | {n["check"] for n in doc["not_shown"]}
        assert "steady.ttft.p90" in said, doc["summary"]
    prefix = next(c for c in doc["checks"] if c["id"] == "shared.engine.prefix_cache_hit_rate")
    assert prefix["decision"] == "fail" and prefix["candidate"] == 0.0, prefix
    # the reference hit its groups' prefixes (0.48 of the prompt tokens looked up, measured:
    # each group's first prompts miss, and a CPU KV block caches only whole blocks)
    assert prefix["reference"] > 0.25, prefix
    assert "shared.engine.prefix_cache_hit_rate" in {r["check"] for r in doc["reasons"]}
    telemetry = doc["scenarios"][1]["telemetry"]
    hits = [v for v in telemetry["reference"]["series"]["prefix_cache_hits_total"] if v]
    assert hits and max(hits) > 0
    caching = {role: telemetry[role]["config"]["prefix_caching"] for role in ROLES}
    assert caching == {"reference": "True", "candidate": "False"}, caching
    check_capacity(doc)


def test_other_weights_hold_on_divergence_through_gate_serve_and_a_template(
    bed: Path, tmp_path: Path
) -> None:
    """The operator's way: `gate serve` with an engine template for this vLLM build (the
    caller picks only the weights and the sequence slots), a `run` token, `POST /v1/gates`.
    The candidate serves another seed's weights: every greedy answer differs."""
    specs = tmp_path / "specs"
    (specs / "engines").mkdir(parents=True)
    template = {
        "description": "vLLM's CPU build from the test bed",
        "engine": {
            "preset": "vllm",
            "python": str(bed / "venv" / "bin" / "python"),
            "args": [*VLLM_ARGS, "--model", "{weights}", "--max-num-seqs", "{slots}"],
            "env": VLLM_ENV,
            "readiness_timeout_s": 600,
        },
        "params": {
            "weights": {
                "type": "choice",
                "choices": {m: str(bed / "models" / m) for m in ("tiny-a", "tiny-b")},
            },
            "slots": {"type": "int", "min": 1, "max": 64, "default": 8},
        },
    }
    (specs / "engines" / "vllm-cpu.yaml").write_text(json.dumps(template))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env |= {"GATE_DATA_DIR": str(tmp_path / ".gate"), "GATE_SPEC_DIR": str(specs)}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = start_api(env, tmp_path / "serve.log", port, tmp_path)
    try:
        api.wait_ready(60)
        made = subprocess.run(
            [sys.executable, "-m", "gate", "token", "create", "ci", "--scopes", "run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        (token,) = re.findall(r"gt_[A-Za-z0-9_-]+", made.stdout)
        auth = {"Authorization": f"Bearer {token}"}
        body = {
            "spec": {
                "name": "vllm-weights",
                "model": "tiny",
                "reference": {"engine": "vllm-cpu", "params": {"weights": "tiny-a"}},
                "candidate": {"engine": "vllm-cpu", "params": {"weights": "tiny-b"}},
                "scenarios": [{"suite": "correctness"}],
            }
        }
        answer = httpx.post(f"{base}/v1/gates", json=body, headers=auth, timeout=30)
        assert answer.status_code == 202, answer.text
        gid = answer.json()["id"]

        def verdict() -> dict[str, Any] | None:
            got = httpx.get(f"{base}/v1/gates/{gid}/verdict", headers=auth, timeout=10).json()
            return got if got.get("verdict") is not None else None

        final = wait_for(verdict, 600, "the gate's verdict", every_s=2)
        doc = httpx.get(f"{base}/v1/gates/{gid}/document", headers=auth, timeout=30).json()
    finally:
        api.stop()
    assert final["verdict"] == "hold", (final, api.log()[-3000:])
    held = {r["check"] for r in doc["reasons"]}
    assert any(c.startswith("correctness.") for c in held), held
    assert "python" not in json.dumps(body)  # the caller never named a program


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


def test_sigkill_of_gate_run_leaves_no_vllm_process(bed: Path, tmp_path: Path) -> None:
    """`kill -9` of `gate run` once both vLLM servers run their three processes each: none of
    the six outlives it (the keeper's parent-death signal ends each engine's tree)."""
    tag = uuid.uuid4().hex
    spec = tmp_path / "spec.yaml"
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


def workload_scenarios() -> list[dict[str, Any]]:
    """The two scenarios of examples/workloads/vllm-cpu.yaml: a trace, multi-turn sessions."""
    data = yaml.safe_load((ROOT / "examples" / "workloads" / "vllm-cpu.yaml").read_text())
    return list(data["scenarios"])


def check_workloads(doc: dict[str, Any], db: Path) -> None:
    """examples/workloads/vllm-cpu.yaml's scenarios on identical vLLM servers: a
    Mooncake-layout trace at its recorded instants, then 3-turn chat sessions beside shared
    system prompts. vLLM answers every request of both (the later turns on its chat endpoint
    with its own earlier answers, within its 1024-token context), the trace's requests leave
    at the file's instants, and the verdict says the sessions' contexts differ after the
    first turn."""
    scenarios = {sc["name"]: sc for sc in doc["scenarios"]}
    replay, chat = scenarios["replay"], scenarios["chat"]
    fails = [c["id"] for c in doc["checks"] if c["decision"] == "fail"]
    assert not [c for c in fails if c.startswith(("replay.", "chat."))], fails
    trace = [json.loads(line) for line in (ROOT / "examples/workloads/short-trace.jsonl").open()]
    assert replay["workload"]["requests"] == len(trace) == 24
    for sc in (replay, chat):
        n = sc["workload"]["requests"]
        assert sc["reference"]["requests"]["ok"] == n == sc["candidate"]["requests"]["ok"]
    stamps = sorted(r["timestamp"] / 1000 for r in trace)
    columns = sample_columns(open_migrated(f"sqlite:///{db}"), doc["gate_id"])
    for role in ("reference", "candidate"):
        intended = sorted(columns["replay"][role].intended_ns.tolist())
        assert all(
            abs((i - intended[0]) / 1e9 - (s - stamps[0])) < 1e-6
            for i, s in zip(intended, stamps, strict=True)
        )
    later = chat["workload"]["later_turns"]
    assert later >= 2 and chat["workload"]["sessions"] >= 1
    assert any("contexts differ after the first turn" in n for n in doc["notes"])
    # identical weights, greedy: the first turns' outputs match (later turns are not compared)
    assert chat["outputs"]["compared"] == chat["workload"]["requests"] - later
    assert chat["outputs"]["exact"] == chat["outputs"]["compared"]


def check_capacity(doc: dict[str, Any]) -> None:
    """The capacity search on vLLM servers of eight slots and one. Both are processes on a host
    with no GPU, so they share its CPUs with the gate: on two cores tasks waited for a CPU
    71-96% of the time at the knees, where identical servers measured ratios of 0.39-2.0 and
    one slot against eight 0.21-1.08 (docs/calibration.md, "Capacity on real vLLM"). The check
    must then say it cannot compare them (gate/analysis/capacity.py) and hold, as an unhealthy
    test bed does, rather than fail or pass on the host's contention. On a host with CPU to
    spare it is judged on its interval."""
    [cap_doc] = doc["capacity"]
    assert cap_doc["shares_host"] is True
    steps = cap_doc["steps"]
    assert len(steps) >= 4 and steps[0]["stage"] == "ramp"
    assert all(0.0 <= s["host_cpu"] <= 1.0 for s in steps), steps
    knee = CapacityDoc.model_validate(cap_doc).search().knee_cpu()
    psi = Path("/proc/pressure/cpu").exists()
    assert knee is not None and knee[0] == ("stall" if psi else "busy")
    limits = {"stall": cap_doc["cpu_stall_limit"], "busy": Policy().load.capacity_host_cpu}
    check = next(c for c in doc["checks"] if c["id"] == "capacity.capacity")
    if knee[1] > limits[knee[0]]:
        assert check["decision"] == "undecided" and check["required"], check
        assert "Not comparable" in check["message"] and "competed for its CPUs" in check["message"]
        assert "capacity.capacity" in {r["check"] for r in doc["reasons"]}
    else:
        assert "Not comparable" not in check["message"], check
