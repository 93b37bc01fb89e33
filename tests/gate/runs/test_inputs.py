"""What the judge is given of the engines (gate/runs/inputs.py): startup phases as durations."""

from __future__ import annotations

import pytest

from gate.analysis.engines import startup_checks
from gate.analysis.policy import Policy
from gate.runs.inputs import EngineEvidence, engine_facts, phase_durations
from gate.verdict.document import EngineDoc

# vLLM's own steps (read from its log) beside the gate's, as a real vLLM 0.32 gate recorded
# them; the other engine logs none of vLLM's steps (another engine family, or a build whose
# lines were reworded).
VLLM = {
    "launched": 0.24,
    "process_up": 0.26,
    "config_resolved": 15.6,
    "weights_loaded": 47.6,
    "kv_cache_sized": 48.4,
    "engine_initialized": 48.8,
    "api_up": 49.6,
    "port_open": 50.1,
    "healthy": 50.4,
    "model_listed": 50.4,
    "warmup_done": 53.6,
    "ready": 53.6,
}
PLAIN = {k: v for k, v in VLLM.items() if k in ("launched", "process_up") or v >= 50.0}


def doc(phases: dict[str, float]) -> EngineDoc:
    return EngineDoc(kind="process", phases=phases, ready_s=phases["ready"])


def test_a_step_only_one_engine_logs_does_not_move_the_shared_phases() -> None:
    """Judge v3 took each phase's gap from the phase before it in the engine's own order: the
    vLLM engine's port_open took 0.5 s (after api_up), the plain one's 49.8 s (after
    process_up), and startup.phase.port_open failed a candidate that started as fast."""
    shared = set(VLLM) & set(PLAIN)
    assert phase_durations(VLLM, shared)["port_open"] == pytest.approx(50.1 - 0.26)
    assert phase_durations(PLAIN, shared) == phase_durations(PLAIN)
    # a step one engine logs keeps its own gap, to be noted, not compared
    assert phase_durations(VLLM, shared)["weights_loaded"] == pytest.approx(47.6 - 15.6)

    facts = engine_facts({"reference": doc(VLLM), "candidate": doc(PLAIN)})
    notes: list[str] = []
    checks = {c.id: c for c in startup_checks(facts, Policy(), notes)}
    assert checks["startup.phase.port_open"].decision == "pass"
    assert all(c.decision == "pass" for c in checks.values()), checks
    assert any("reported by one engine only" in n and "weights_loaded" in n for n in notes)


def test_without_the_other_engine_the_order_is_the_engines_own() -> None:
    assert phase_durations(VLLM)["port_open"] == pytest.approx(50.1 - 49.6)


def test_the_engine_up_first_is_not_held_for_waiting_on_the_other() -> None:
    """The gate warms both engines up together once both list their model, and marks
    `warmup_done` and `ready` on both at its end (gate/runs/engine_pair.py `warm_up`). The
    candidate up 5 s before the reference waited 5 s for it: an A/A gate of real vLLM on a
    busy host held on startup.phase.warmup_done (6.4 s against 1.2 s). That wait is taken
    out of its warm-up phase and its ready time; a candidate up 5 s *after* the reference is
    still held for it."""
    early = {k: (v - 5.0 if 0.3 < v < 53 else v) for k, v in VLLM.items()}  # up 5 s sooner
    facts = {f.role: f for f in engine_facts({"reference": doc(VLLM), "candidate": doc(early)})}
    assert facts["candidate"].phases["warmup_done"] == pytest.approx(53.6 - 50.4)
    assert facts["reference"].phases["warmup_done"] == pytest.approx(53.6 - 50.4)
    assert facts["candidate"].ready_s == pytest.approx(53.6 - 5.0)
    assert facts["reference"].ready_s == pytest.approx(53.6)
    checks = {c.id: c for c in startup_checks(list(facts.values()), Policy(), [])}
    assert all(c.decision == "pass" for c in checks.values()), checks
    # a line the engine logs during the warm-up itself does not move where its wait ended
    logged = engine_facts({"reference": doc(VLLM), "candidate": doc({**early, "warmed_up": 52.0})})
    assert {f.role: f.ready_s for f in logged} == pytest.approx(
        {"reference": 53.6, "candidate": 53.6 - 5.0}
    )

    # up 30 s later (its config took 30 s longer): the warm-up waited for it
    late = {k: (v + 30.0 if 0.3 < v < 53 else v) for k, v in VLLM.items()}
    late["warmup_done"] = late["ready"] = 83.6
    ref = {**VLLM, "warmup_done": 83.6, "ready": 83.6}
    slow = engine_facts({"reference": doc(ref), "candidate": doc(late)})
    by_role = {f.role: f for f in slow}
    assert by_role["reference"].ready_s == pytest.approx(83.6 - 30.0)  # its wait taken out
    assert by_role["candidate"].ready_s == pytest.approx(83.6)
    held = {c.id: c for c in startup_checks(slow, Policy(), [])}
    assert held["startup.phase.config_resolved"].decision == "fail"


def test_a_stored_document_carries_each_launchs_host_contention_to_the_judge() -> None:
    # Judged again from the stored document, the startup guard reads what the live gate read.
    busy = doc(VLLM).model_copy(update={"launch_host_busy": 0.8, "launch_cpu_wait_s": 1.25})
    facts = {f.role: f for f in engine_facts({"reference": doc(VLLM), "candidate": busy})}
    assert (facts["candidate"].launch_host_busy, facts["candidate"].launch_cpu_wait_s) == (
        0.8,
        1.25,
    )
    assert facts["reference"].launch_host_busy is None  # an older document: not measured
    stored = EngineEvidence.stored(busy)
    assert (stored.launch_host_busy, stored.launch_cpu_wait_s) == (0.8, 1.25)
    with pytest.raises(ValueError, match="launch_host_busy"):
        EngineDoc.model_validate({"kind": "process", "launch_host_busy": 1.5})
