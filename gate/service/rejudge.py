"""Judge a finished gate's stored samples again, under another policy (what Kayenta calls
re-judging stored metric data): nothing is launched, nothing is re-measured.

The stored per-request columns and the verdict document (the engines' startup phases and
crashes, the compatibility probes, where each scenario's last look stopped it, its load phases)
feed the judge through the same function as the live run (inputs.py): a scenario the run
stopped early is judged on the prefix its last look saw (later requests were in flight, not
evidence), and the warm-up is the new policy's. The sample sizes are the run's, so the new
policy judges them at once (a fixed-sample decision, no new looks). The correctness suite's raw
probes are not stored, so its divergence checks are not re-judged (the answer says so).
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.advisory import unmatched
from gate.analysis.policy import Policy
from gate.analysis.types import Verdict
from gate.core.errors import FieldProblem, GateConflict, SpecError
from gate.core.vocabulary import FINISHED
from gate.runs.inputs import RanScenario, judge_gate, judge_inputs, stored_engines
from gate.service import service
from gate.spec import parse_spec
from gate.verdict.document import VerdictDocument

NOT_REJUDGED = (
    "The correctness suite's divergence checks are not re-judged: its raw probes are not stored."
)


def rejudge(factory: sessionmaker[Session], gate_id: str, policy: Policy) -> Verdict:
    run = service.get_gate(factory, gate_id)
    if run.state not in FINISHED or run.document is None:
        raise GateConflict(
            f"gate {gate_id} is {run.state}; only a finished gate's samples can be re-judged"
        )
    doc = VerdictDocument.read(run.document)
    # The stored policy is replaced by `policy` (validated under the same caps by its model),
    # so a stored one the caps now refuse does not stop its samples from being judged again.
    stored = {k: v for k, v in run.spec.items() if k != "policy"}
    spec = parse_spec(stored, source=f"gate {gate_id}")
    stages = [sc.name for sc in spec.stages]
    wrong = [
        FieldProblem(f"policy.advisory[{i}]", why)
        for i, why in unmatched(policy.advisory, policy, stages)
    ]
    if wrong:
        raise SpecError(wrong, f"the policy for gate {gate_id}")
    ran_docs = {sc.name: sc for sc in doc.scenarios or []}
    ran = [
        replace(RanScenario.stored(cols, ran_docs.get(name)), name=name)
        for name, cols in service.sample_columns(factory, gate_id).items()
    ]
    found = judge_inputs(
        {sc.name: sc for sc in spec.scenarios},
        ran,
        stored_engines(doc.engines),
        doc.probes,
        policy.warmup_requests,
        capacity=doc.capacity,
    )
    pairs = sum(c.envelope_pairs for c in doc.correctness or [])
    early = sum(c.envelope_early for c in doc.correctness or [])
    verdict = judge_gate(found, policy, envelope_share=early / pairs if pairs else None)
    if doc.correctness:
        verdict = replace(verdict, notes=(*verdict.notes, NOT_REJUDGED))
    return verdict
