"""What the judge is given of the engines (gate/runs/inputs.py): startup phases as durations."""

from __future__ import annotations

import pytest

from gate.analysis.engines import startup_checks
from gate.analysis.policy import Policy
from gate.runs.inputs import engine_facts, phase_durations
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
