"""The numerical divergence of the correctness suite: greedy and teacher-forced pairs from
the probes of both engines, the examples shown in the verdict, and its correctness section."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from gate.analysis.divergence import (
    DivergenceSamples,
    GreedyPair,
    GreedyRun,
    Scored,
    TeacherForcedPair,
    Token,
    envelope_early_counts,
    greedy_stats,
)
from gate.analysis.policy import Policy
from gate.core.vocabulary import Role
from gate.verdict.document import (
    AbsDeltaDoc,
    Answered,
    CorrectnessDoc,
    DivergenceExample,
    EngineFailure,
    ProbeDivergenceDoc,
)
from loadgen import suite as catalogue

MAX_EXAMPLES = 5
_EXAMPLE_TOKENS = 64


@dataclass
class CorrectnessRun:
    """What the correctness suite brought back from one scenario: greedy probes on both
    engines (one at a time) and on the reference again under load, and, where run, the
    teacher-forced scores of the reference's continuations (`scored`: the probe indices)."""

    name: str
    max_tokens: int
    reference: list[catalogue.CorrectnessResult]
    candidate: list[catalogue.CorrectnessResult]
    reference_loaded: list[catalogue.CorrectnessResult]
    scored: list[int] = field(default_factory=list)
    scores: dict[str, list[catalogue.ScoreResult]] = field(default_factory=dict)
    unaligned: int = 0  # probes left to the text: an engine's entries are not one per token

    @property
    def by_id(self) -> bool:
        """Compare tokens by id: every answer gave its token ids and a top-k keyed by id
        (llama.cpp's entries do; vLLM's do when asked with `return_tokens_as_token_ids`, which
        the probes ask only when both engines honour it: probes.adapt_to). Texts are not
        unique (every partial UTF-8 byte token reads "\ufffd"), so a text key merges distinct
        tokens; an engine keyed by text keeps the whole run on text, one kind for the whole
        run."""
        answered = [
            r for r in (*self.reference, *self.candidate, *self.reference_loaded) if r.error is None
        ]
        return bool(answered) and all(
            r.token_ids is not None and r.top_logprobs_by_id is not None for r in answered
        )


def _greedy(
    result: catalogue.CorrectnessResult, max_tokens: int, by_id: bool = False
) -> GreedyRun | str:
    """The probe as a greedy run, or what makes it unusable."""
    if result.error is not None:
        return result.error
    tokens: Sequence[Token] | None = result.tokens
    tops: Sequence[Mapping[Token, float]] | None = cast(
        "Sequence[Mapping[Token, float]] | None", result.top_logprobs
    )
    lps = result.logprobs
    if by_id:
        tokens = result.token_ids
        tops = cast("Sequence[Mapping[Token, float]] | None", result.top_logprobs_by_id)
    if tokens is None or lps is None or tops is None:
        return f"HTTP {result.status}: the answer has no logprobs"
    if not len(tokens) == len(lps) == len(tops):
        return (
            f"HTTP {result.status}: {len(tokens)} tokens but {len(lps)} logprobs and "
            f"{len(tops)} top-k entries"
        )
    return GreedyRun(tokens, lps, tops, max_tokens=max_tokens)


def _scored(score: catalogue.ScoreResult) -> Scored | str:
    if score.error is not None or score.logprobs is None or score.top is None:
        return score.error or "no scores"
    return Scored(score.logprobs, cast("list[Mapping[Token, float]]", score.top))


Failures = list[tuple[Role, str]]


def _greedy_pairs(
    run: CorrectnessRun, failures: Failures
) -> tuple[list[GreedyPair], list[GreedyPair], set[int]]:
    """Free-run greedy pairs (reference vs candidate; reference alone vs under load), and
    the probes the reference answered usably."""
    greedy: list[GreedyPair] = []
    envelope: list[GreedyPair] = []
    usable: set[int] = set()
    for i, (r, c, rl) in enumerate(
        zip(run.reference, run.candidate, run.reference_loaded, strict=True)
    ):
        a = _greedy(r, run.max_tokens, run.by_id)
        if isinstance(a, str):
            failures.append(("reference", a))
            continue
        usable.add(i)
        b = _greedy(c, run.max_tokens, run.by_id)
        if isinstance(b, str):
            failures.append(("candidate", b))
        elif r.aligned and c.aligned:
            greedy.append(GreedyPair(a, b))
        else:
            run.unaligned += 1
        e = _greedy(rl, run.max_tokens, run.by_id)
        if isinstance(e, str):
            failures.append(("reference", f"under load: {e}"))
        elif r.aligned and rl.aligned:
            envelope.append(GreedyPair(a, e))
    return greedy, envelope, usable


def _teacher_pairs(
    run: CorrectnessRun, usable: set[int], failures: Failures, notes: list[str]
) -> tuple[list[TeacherForcedPair], list[TeacherForcedPair]]:
    """Teacher-forced pairs of the reference's continuations, scored by both engines and by
    the reference under load; none when an engine does not do prompt_logprobs (a note)."""
    teacher: list[TeacherForcedPair] = []
    envelope: list[TeacherForcedPair] = []
    if not run.scores:
        return teacher, envelope
    s_ref, s_cand, s_load = (run.scores[k] for k in ("reference", "candidate", "loaded"))
    unsupported = [
        role
        for role, scores in (("reference", s_ref), ("candidate", s_cand))
        if scores and not any(s.supported for s in scores)
    ]
    if unsupported:
        notes.append(
            f"Teacher-forced scoring in {run.name} skipped: the {' and '.join(unsupported)} "
            "does not support prompt_logprobs; free-run greedy only."
        )
        return teacher, envelope
    for j, i in enumerate(run.scored):
        if i not in usable:
            continue
        ids = run.reference[i].token_ids or []
        sa = _scored(s_ref[j])
        if isinstance(sa, str):
            failures.append(("reference", f"teacher-forced scoring: {sa}"))
            continue
        sb = _scored(s_cand[j])
        if isinstance(sb, str):
            failures.append(("candidate", f"teacher-forced scoring: {sb}"))
        else:
            teacher.append(TeacherForcedPair(ids, sa, sb))
        se = _scored(s_load[j])
        if isinstance(se, str):
            failures.append(("reference", f"teacher-forced scoring under load: {se}"))
        else:
            envelope.append(TeacherForcedPair(ids, sa, se))
    return teacher, envelope


def divergence_samples(run: CorrectnessRun, notes: list[str]) -> DivergenceSamples:
    """Candidate pairs (reference vs candidate) and envelope pairs (reference alone vs the
    reference under load), free-run greedy and teacher-forced, plus every probe an engine
    could not answer."""
    failures: Failures = []
    run.unaligned = 0
    greedy, env_greedy, usable = _greedy_pairs(run, failures)
    if run.unaligned:
        notes.append(
            f"{run.name}: {run.unaligned} probe(s) not compared token by token: an engine "
            "gave fewer logprob entries than tokens (llama.cpp merges tokens that end inside a "
            "UTF-8 character), so positions do not line up; the load scenarios' outputs are still "
            "compared as text."
        )
    teacher, env_teacher = _teacher_pairs(run, usable, failures, notes)
    return DivergenceSamples(
        teacher=teacher,
        greedy=greedy,
        envelope_teacher=env_teacher,
        envelope_greedy=env_greedy,
        failures=failures,
    )


def merge_divergence(parts: Sequence[DivergenceSamples]) -> DivergenceSamples | None:
    """Several correctness scenarios judged as one set of prompts."""
    if not parts:
        return None
    return DivergenceSamples(
        teacher=[p for d in parts for p in d.teacher],
        greedy=[p for d in parts for p in d.greedy],
        envelope_teacher=[p for d in parts for p in d.envelope_teacher],
        envelope_greedy=[p for d in parts for p in d.envelope_greedy],
        failures=[f for d in parts for f in d.failures],
    )


def divergence_examples(
    run: CorrectnessRun, policy: Policy, limit: int = MAX_EXAMPLES
) -> list[DivergenceExample]:
    """The greedy outputs where the candidate left the reference, worst first (a token
    outside the reference's top-k, then the largest margin): what a person looks at first."""
    dp = policy.divergence
    found: list[tuple[float, DivergenceExample]] = []
    for r, c in zip(run.reference, run.candidate, strict=True):
        a, b = _greedy(r, run.max_tokens, run.by_id), _greedy(c, run.max_tokens, run.by_id)
        if isinstance(a, str) or isinstance(b, str) or not (r.aligned and c.aligned):
            continue
        st = greedy_stats(GreedyPair(a, b), dp.top_k, dp.runaway_factor)
        if st.first_divergence is None:
            continue
        margin = None if st.margin is None or not math.isfinite(st.margin) else st.margin
        worst = math.inf if st.outside_top_k else (margin if margin is not None else -1.0)
        found.append(
            (
                worst,
                DivergenceExample(
                    prompt=r.prompt,
                    reference_tokens=_shown(r, a)[:_EXAMPLE_TOKENS],
                    candidate_tokens=_shown(c, b)[:_EXAMPLE_TOKENS],
                    index=st.first_divergence,
                    margin=round(margin, 4) if margin is not None else None,
                    outside_top_k=st.outside_top_k,
                    scenario=run.name,
                ),
            )
        )
    found.sort(key=lambda kv: -kv[0])
    return [doc for _, doc in found[:limit]]


_DELTA_CAP = 4096


def _shown(result: catalogue.CorrectnessResult, run: GreedyRun) -> list[str]:
    """The tokens as a person reads them: their text where the engine gave it (runs compared
    by id show the text still), else what the run compares."""
    if result.tokens is not None and len(result.tokens) == len(run.token_ids):
        return list(result.tokens)
    return [str(t) for t in run.token_ids]


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def probe_divergence(run: CorrectnessRun, policy: Policy) -> list[ProbeDivergenceDoc]:
    """Per greedy probe both engines answered: where they part and the tokens there."""
    dp = policy.divergence
    out: list[ProbeDivergenceDoc] = []
    for i, (r, c) in enumerate(zip(run.reference, run.candidate, strict=True)):
        a, b = _greedy(r, run.max_tokens, run.by_id), _greedy(c, run.max_tokens, run.by_id)
        if isinstance(a, str) or isinstance(b, str) or not (r.aligned and c.aligned):
            continue
        st = greedy_stats(GreedyPair(a, b), dp.top_k, dp.runaway_factor)
        j = st.first_divergence
        doc = ProbeDivergenceDoc(probe=i, first=j, length=len(a.token_ids))
        if j is not None and j < min(len(a.token_ids), len(b.token_ids)):
            tb = b.token_ids[j]
            of_b = a.top[j].get(tb)
            margin = st.margin if st.margin is not None and math.isfinite(st.margin) else None
            doc = doc.model_copy(
                update={
                    "reference_token": _shown(r, a)[j],
                    "reference_logprob": _sig(a.logprobs[j]),
                    "candidate_token": _shown(c, b)[j],
                    "candidate_logprob": _sig(b.logprobs[j]),
                    "reference_logprob_of_candidate": _sig(of_b) if of_b is not None else None,
                    "margin": _sig(margin) if margin is not None else None,
                    "outside_top_k": st.outside_top_k,
                }
            )
        out.append(doc)
    return out


def abs_delta_logprob(data: DivergenceSamples, policy: Policy) -> AbsDeltaDoc | None:
    """Teacher-forced |delta logprob| per position, both sets of pairs (None: no scoring)."""
    if not data.teacher and not data.envelope_teacher:
        return None

    def deltas(pairs: Sequence[TeacherForcedPair]) -> list[float]:
        vals = [
            abs(x - y)
            for p in pairs
            for x, y in zip(p.a.logprobs, p.b.logprobs, strict=True)
            if math.isfinite(x) and math.isfinite(y)
        ]
        return [_sig(v) for v in vals[:_DELTA_CAP]]

    dp = policy.divergence
    return AbsDeltaDoc(
        candidate=deltas(data.teacher),
        envelope=deltas(data.envelope_teacher),
        floor_nat=dp.floor_nat,
        envelope_tolerance=dp.envelope_tolerance,
    )


def correctness_doc(
    run: CorrectnessRun, data: DivergenceSamples, policy: Policy | None = None
) -> CorrectnessDoc:
    """A correctness scenario's summary for the verdict document."""
    policy = policy or Policy()

    def answered(results: Sequence[catalogue.CorrectnessResult]) -> int:
        return sum(not isinstance(_greedy(x, run.max_tokens, run.by_id), str) for x in results)

    exact = sum(p.a.token_ids == p.b.token_ids for p in data.greedy)
    return CorrectnessDoc(
        name=run.name,
        probes=len(run.reference),
        answered=Answered(
            reference=answered(run.reference),
            candidate=answered(run.candidate),
            reference_under_load=answered(run.reference_loaded),
        ),
        exact_matches=exact,
        envelope_exact_matches=sum(p.a.token_ids == p.b.token_ids for p in data.envelope_greedy),
        teacher_forced=len(data.teacher),
        failures=[EngineFailure(engine=role, message=m[:300]) for role, m in data.failures[:20]],
        probe_divergence=probe_divergence(run, policy),
        abs_delta_logprob=abs_delta_logprob(data, policy),
        envelope_early=envelope_early_counts(data, policy)[0],
        envelope_pairs=len(data.envelope_greedy),
    )
