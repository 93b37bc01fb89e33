"""What a gate run feeds the judge beyond each scenario's samples: live looks that stop a
scenario early, the load phases of peak, overload and recovery scenarios, and the numerical
divergence of the correctness suite.

Live looks (`LiveLooks`): a `SequentialJudge` under the gate's `Plan` looks at the prefix of the
schedule that both engines have finished, every `look_every` requests per arm. A prefix by
request id, not whatever has come back: the requests still in flight at a look are the slow
ones, and judging only the finished ones would flatter the slower engine. Every sequence of the
plan holds at every prefix at once, so the gate may act on any look; when one says the
scenario's verdict cannot change (a check failed, or every check is decided) the scenario stops,
and the final judge is given exactly that prefix, so the verdict is the look's (plus estimate
intervals), never a fixed-sample test run again after an optional stop. Records are turned into
columns in batches and the look runs in a worker thread: the event loop only files records.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

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
from gate.analysis.load import OverloadPhase, PeakPhase, RequestLog, Slo
from gate.analysis.outputs import MirroredOutputs, Output, OutputExample, compare_outputs
from gate.analysis.policy import Policy
from gate.analysis.samples import (
    ERROR_KINDS,
    Columns,
    columns_from_records,
    concat_columns,
    select_requests,
    take_requests,
)
from gate.analysis.sequential import Look, SequentialJudge
from gate.core.vocabulary import ROLES, Role
from gate.verdict.document import (
    AbsDeltaDoc,
    Answered,
    CorrectnessDoc,
    DivergenceExample,
    EarlyStopDoc,
    EngineFailure,
    OutputExampleDoc,
    OutputsDoc,
    ProbeDivergenceDoc,
)
from loadgen import suite as catalogue
from loadgen.records import RequestRecord

MAX_EXAMPLES = 5
_EXAMPLE_TOKENS = 64


# --------------------------------------------------------------------------- early stop


@dataclass(frozen=True)
class EarlyStop:
    """A scenario stopped before the end of its schedule: judged on the schedule's first
    `upto` requests (`requests` per arm after the warm-up) because of `checks`. Reason
    "planned": a scenario that could have extended (policy `extend`) ended at or past its
    planned size because nothing was undecided any more."""

    scenario: str
    requests: int
    planned: int
    upto: int
    reason: Literal["hold", "decided", "planned"]
    checks: tuple[str, ...]

    @property
    def message(self) -> str:
        at = f"{self.requests} of {self.planned} planned requests per arm"
        if self.reason == "planned":
            if self.requests <= self.planned:
                return (
                    f"{self.scenario} ended at its planned {self.planned} requests per arm with "
                    "no check undecided, so it did not need its extension."
                )
            return (
                f"{self.scenario} ended at {self.requests} requests per arm, past its planned "
                f"{self.planned}: it ran on until no check was undecided."
            )
        if self.reason == "hold":
            return (
                f"{self.scenario} stopped early at {at}: {', '.join(self.checks)} failed, and no "
                "more samples could turn the hold into a continue."
            )
        return (
            f"{self.scenario} stopped early at {at}: every check was decided, so more samples "
            "could not change its verdict."
        )

    def describe(self) -> EarlyStopDoc:
        return EarlyStopDoc(
            requests=self.requests,
            planned=self.planned,
            upto=self.upto,
            reason=self.reason,
            checks=list(self.checks),
            message=self.message,
        )


@dataclass
class LiveLooks:
    """Looks at one running scenario (module docstring); `add` is the run's record callback.

    hold_only: stop only on a failed check (scenarios whose load checks, judged at the end, the
    looks do not see); on_stop: called once, on the event loop, when the scenario may stop.
    """

    judge: SequentialJudge
    scenario: str
    warmup: int
    look_every: int
    zero_ns: int
    on_stop: Callable[[EarlyStop], None]
    hold_only: bool = False
    # Resolved by the look at the planned size when the schedule pauses there (loadgen Pause):
    # True runs the extension, False ends the scenario at its plan.
    go: asyncio.Future[bool] | None = None
    looks: int = 0
    stopped: EarlyStop | None = None
    last: Look | None = None
    _next: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    _pending: dict[str, dict[int, RequestRecord]] = field(
        default_factory=lambda: {r: {} for r in ROLES}
    )
    _ready: dict[str, list[RequestRecord]] = field(default_factory=lambda: {r: [] for r in ROLES})
    _cols: dict[str, list[Columns]] = field(default_factory=lambda: {r: [] for r in ROLES})
    _due: int = 0
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._due = min(self.look_every, self.planned)

    @property
    def planned(self) -> int:
        return int(self.judge.plan.requests[self.scenario])

    def add(self, rec: RequestRecord) -> None:
        role = rec.target
        if role not in self._next or self.stopped is not None:
            return
        pending = self._pending[role]
        pending[rec.request_id] = rec
        nxt = self._next[role]
        while nxt in pending:
            self._ready[role].append(pending.pop(nxt))
            nxt += 1
        self._next[role] = nxt
        self._maybe_look()

    def _maybe_look(self) -> None:
        if self.stopped is not None:
            return
        upto = min(self._next.values())
        judged = upto - self.warmup
        if judged < self._due or self._task is not None:
            return
        if self._due == self.planned < judged:
            # The look at the planned size decides whether to extend: it sees exactly that
            # prefix, however far the finished requests have run ahead of it.
            upto, judged = self.planned + self.warmup, self.planned
        self._due = (judged // self.look_every + 1) * self.look_every
        if judged < self.planned < self._due:
            self._due = self.planned  # a look exactly at the planned size: extend or not
        batches: dict[str, list[RequestRecord]] = {}
        for r in ROLES:
            ready = self._ready[r]
            take = upto - (self._next[r] - len(ready))
            batches[r], self._ready[r] = ready[:take], ready[take:]
        self._task = asyncio.create_task(self._look(batches, upto))

    async def _look(self, batches: Mapping[str, list[RequestRecord]], upto: int) -> None:
        try:
            look = await asyncio.to_thread(self._compute, batches)
        except BaseException:
            self._resolve(False)  # a paused schedule must never wait for a look that failed
            raise
        finally:
            self._task = None
        self.looks += 1
        self.last = look
        if look.past_plan:
            self._resolve(look.extending and not look.stop)
        if self.stopped is not None or look.at_limit or not look.stop:
            # Records that came in while this look ran may make the next one due already
            # (a paused schedule sends nothing more to trigger it).
            self._maybe_look()
            return
        if self.hold_only and not look.hold:
            return
        failed = tuple(c.id for c in look.checks if c.decision == "fail")
        reason: Literal["hold", "decided", "planned"] = (
            "hold" if look.hold else "planned" if look.past_plan else "decided"
        )
        self.stopped = EarlyStop(
            scenario=self.scenario,
            requests=min(look.samples),
            planned=look.planned,
            upto=upto,
            reason=reason,
            checks=failed if look.hold else tuple(c.id for c in look.checks),
        )
        self.on_stop(self.stopped)

    def _compute(self, batches: Mapping[str, list[RequestRecord]]) -> Look:
        arms = {}
        for role in ROLES:
            parts = self._cols[role]
            parts.append(columns_from_records(batches[role], self.zero_ns))
            whole = concat_columns(parts)
            self._cols[role] = [whole]
            arms[role] = select_requests(whole, self.warmup).to_arm()
        return self.judge.look(self.scenario, arms["reference"], arms["candidate"])

    def _resolve(self, extend: bool) -> None:
        if self.go is not None and not self.go.done():
            self.go.set_result(extend)

    async def close(self) -> None:
        """The scenario ended: a look still running decides nothing any more."""
        self._resolve(False)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# --------------------------------------------------------------------------- load phases


def request_log(cols: Columns) -> RequestLog:
    """One engine's requests as the load checks read them; send times are the schedule's
    (identical on both arms), so windows cut both engines at the same requests."""
    ok = cols.ok
    sent = cols.sent_ns.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ttft = np.where(ok & (cols.first_token_ns >= 0), (cols.first_token_ns - sent) / 1e6, np.nan)
        e2e = np.where(cols.end_ns >= 0, (cols.end_ns - sent) / 1e6, np.nan)
    return RequestLog(
        sent_s=cols.intended_ns / 1e9,
        ttft_ms=ttft,
        itl_ms=np.where(ok, cols.itl_mean_ns / 1e6, np.nan),
        e2e_ms=e2e,
        status=cols.status,
        error=tuple(None if e < 0 else ERROR_KINDS[int(e)] for e in cols.error),
    )


def _paired(reference: Columns, candidate: Columns) -> tuple[Columns, Columns]:
    """Both arms cut to the requests both have (a stopped run may miss some on one side)."""
    common = np.intersect1d(reference.request_id, candidate.request_id)
    out = []
    for cols in (reference, candidate):
        out.append(_subset(cols, np.isin(cols.request_id, common)))
    return out[0], out[1]


def _subset(cols: Columns, keep: np.ndarray) -> Columns:
    return cols if bool(keep.all()) else take_requests(cols, keep)


def load_phases(
    name: str,
    suite: str | None,
    settings: Mapping[str, Any],
    reference: Columns,
    candidate: Columns,
    marks: Sequence[tuple[str, float]],
) -> tuple[list[PeakPhase], list[OverloadPhase]]:
    """The peak or overload phase of a suite scenario (warm-up already dropped), else none.

    peak: the whole scenario, goodput under the suite's SLOs. overload and recovery: the
    overload window from the schedule's phases; a ramp into it is left out (neither the level
    before the overload nor the overload itself).
    """
    if suite not in ("peak", "overload", "recovery"):
        return [], []
    ref, cand = _paired(reference, candidate)
    if suite == "peak":
        cfg = catalogue.get("peak", **settings)
        assert isinstance(cfg, catalogue.Peak)
        slo = Slo(ttft_ms=cfg.slo_ttft_ms, itl_ms=cfg.slo_itl_ms, e2e_ms=cfg.slo_e2e_ms)
        return [PeakPhase(name, request_log(ref), request_log(cand), slo)], []
    cfg_o = catalogue.get(suite, **settings)
    assert isinstance(cfg_o, catalogue.Overload)
    names = [n for n, _ in marks]
    if "overload" not in names:
        return [], []
    i = names.index("overload")
    start = marks[i][1]
    end = start + cfg_o.overload_s
    if "ramp" in names:
        ramp = names.index("ramp")
        ref = _subset(ref, ref.phase != ramp)
        cand = _subset(cand, cand.phase != ramp)
    return [], [OverloadPhase(name, request_log(ref), request_log(cand), start, end)]


# --------------------------------------------------------------------------- divergence


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


# --------------------------------------------------------------------------- mirrored outputs


def _output(rec: RequestRecord) -> Output:
    return Output(text=rec.text, tokens=rec.output_tokens, token_ids=rec.token_ids)


def mirrored_outputs(
    name: str, records: Mapping[str, Sequence[RequestRecord]], early_tokens: int
) -> MirroredOutputs:
    """The scenario's mirrored outputs compared, every request both engines answered."""
    ref, cand = (
        {r.request_id: _output(r) for r in records.get(role, ()) if r.ok} for role in ROLES
    )
    return compare_outputs(name, ref, cand, early_tokens)


def outputs_doc(o: MirroredOutputs) -> OutputsDoc:
    return OutputsDoc(
        compared=o.compared,
        exact=o.exact,
        early=o.early,
        early_tokens=o.early_tokens,
        basis=o.basis,
        histogram=list(o.histogram),
        examples=[
            OutputExampleDoc(
                request_id=e.request_id,
                position=e.position,
                reference=e.reference,
                candidate=e.candidate,
            )
            for e in o.examples
        ],
        blocks=[(n, e) for n, e in o.blocks],
    )


def outputs_from_doc(name: str, doc: OutputsDoc) -> MirroredOutputs:
    """A stored comparison, for re-judge."""
    return MirroredOutputs(
        scenario=name,
        compared=doc.compared,
        exact=doc.exact,
        early=doc.early,
        early_tokens=doc.early_tokens,
        basis=doc.basis,
        histogram=tuple(doc.histogram),
        examples=tuple(
            OutputExample(e.request_id, e.position, e.reference, e.candidate) for e in doc.examples
        ),
        blocks=tuple((n, e) for n, e in doc.blocks),
    )
