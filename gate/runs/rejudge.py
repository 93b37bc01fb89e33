"""Judge a finished gate's stored samples again, under another policy (what Kayenta calls
re-judging stored metric data): nothing is launched, nothing is re-measured.

The stored per-request columns, the engines' recorded facts (startup phases, crashes) and the
compatibility probes feed the same judge as the live run. Early stopping is not replayed: the
whole stored sample is judged at once with the new policy's thresholds and alpha.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.compat import ProbePair, ProbeResult
from gate.analysis.judge import judge
from gate.analysis.policy import Policy
from gate.analysis.types import EngineFacts, ScenarioSamples, Verdict
from gate.core.database import transaction
from gate.models import SampleSet
from gate.runs import store
from gate.runs.samples import Columns, drop_warmup
from gate.runs.service import _phase_durations

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
    scenarios = [
        ScenarioSamples(
            name=name,
            reference=drop_warmup(cols["reference"], warm).to_arm(),
            candidate=drop_warmup(cols["candidate"], warm).to_arm(),
        )
        for name, cols in by_scenario.items()
        if set(cols) == set(ROLES)
    ]
    doc = run.document
    return judge(scenarios, _engine_facts(doc), policy, probes=_probes(doc))
