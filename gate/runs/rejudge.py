"""Judge a finished gate's stored samples again, under another policy (what Kayenta calls
re-judging stored metric data): nothing is launched, nothing is re-measured.

The stored per-request columns, the engines' recorded facts (startup phases, crashes) and the
compatibility probes feed the same judge as the live run, the same way: a scenario the run
stopped early is judged on the prefix its last look saw (later requests were in flight, not
evidence), peak and overload phases are rebuilt from the schedule's phases, and the warm-up is
the new policy's. The sample sizes are the run's, so the new policy judges them at once (a
fixed-sample decision, no new looks). The correctness suite's raw probes are not stored, so
its divergence checks are not re-judged (the answer says so in a note).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.compat import ProbePair, ProbeResult
from gate.analysis.judge import judge
from gate.analysis.load import OverloadPhase, PeakPhase
from gate.analysis.policy import Policy
from gate.analysis.samples import Columns, select_requests
from gate.analysis.types import EngineFacts, ScenarioSamples, Verdict
from gate.core.database import transaction
from gate.models import SampleSet
from gate.runs import store
from gate.runs.judging import load_phases
from gate.runs.service import _phase_durations
from gate.spec import parse_spec

ROLES = ("reference", "candidate")


def _engine_facts(doc: Mapping[str, Any]) -> list[EngineFacts]:
    facts = []
    for role in ROLES:
        eng = (doc.get("engines") or {}).get(role) or {}
        crash = eng.get("crash")
        ready = eng.get("ready_s")
        reached = {k: float(v) for k, v in (eng.get("phases") or {}).items()}
        phases = _phase_durations(reached) if ready is not None else {}
        facts.append(
            EngineFacts(
                role=role,  # type: ignore[arg-type]
                ready_s=ready,
                crashed=crash is not None,
                crash_detail=crash.get("description") if crash else None,
                phases=phases,
            )
        )
    return facts


def _probes(doc: Mapping[str, Any]) -> list[ProbePair]:
    out = []
    for p in doc.get("probes") or []:
        sides = []
        for role in ROLES:
            r = p[role]
            sides.append(
                ProbeResult(
                    ok=bool(r["ok"]),
                    status=int(r.get("status") or 0),
                    well_formed=not r.get("problems"),
                    problems=tuple(r.get("problems") or ()),
                )
            )
        out.append(ProbePair(p["name"], sides[0], sides[1]))
    return out


def rejudge(factory: sessionmaker[Session], gate_id: str, policy: Policy) -> Verdict:
    run = store.get_gate(factory, gate_id)
    if run.state not in store.FINISHED or run.document is None:
        raise store.GateConflict(
            f"gate {gate_id} is {run.state}; only a finished gate's samples can be re-judged"
        )
    with transaction(factory) as s:
        rows = s.scalars(
            select(SampleSet).where(SampleSet.gate_id == gate_id).order_by(SampleSet.id)
        ).all()
        by_scenario: dict[str, dict[str, Columns]] = {}
        for row in rows:
            by_scenario.setdefault(row.scenario, {})[row.role] = Columns.from_bytes(row.columns)
    warm = policy.warmup_requests
    doc = run.document
    # The stored policy is replaced by `policy` (validated under the same caps by its model),
    # so a stored one the caps now refuse does not stop its samples from being judged again.
    stored = {k: v for k, v in run.spec.items() if k != "policy"}
    spec = parse_spec(stored, source=f"gate {gate_id}")
    specs = {sc.name: sc for sc in spec.scenarios}
    ran = {sc["name"]: sc for sc in doc.get("scenarios") or []}
    scenarios: list[ScenarioSamples] = []
    peaks: list[PeakPhase] = []
    overloads: list[OverloadPhase] = []
    for name, cols in by_scenario.items():
        if set(cols) != set(ROLES) or name not in specs:
            continue
        early = (ran.get(name) or {}).get("early_stop") or {}
        upto = early.get("upto")
        ref = select_requests(cols["reference"], warm, upto)
        cand = select_requests(cols["candidate"], warm, upto)
        scenarios.append(ScenarioSamples(name, ref.to_arm(), cand.to_arm()))
        marks = [(p["name"], float(p["start_s"])) for p in (ran.get(name) or {}).get("phases", [])]
        sc = specs[name]
        p, o = load_phases(name, sc.suite, sc.settings, ref, cand, marks)
        peaks.extend(p)
        overloads.extend(o)
    verdict = judge(
        scenarios,
        _engine_facts(doc),
        policy,
        peaks=peaks,
        overloads=overloads,
        probes=_probes(doc),
    )
    if doc.get("correctness"):
        note = (
            "The correctness suite's divergence checks are not re-judged: its raw probes are "
            "not stored."
        )
        verdict = replace(verdict, notes=(*verdict.notes, note))
    return verdict
