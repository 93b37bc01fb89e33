"""What the run feeds the judge, without engines: live looks on the finished prefix of the
schedule, load phases from phased columns, divergence samples from correctness probes."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.analysis.judge import judge
from gate.analysis.outputs import mirrored_output_checks
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.samples import Columns, columns_from_records, concat_columns, select_requests
from gate.analysis.sequential import SequentialJudge
from gate.analysis.types import ScenarioSamples
from gate.runs.correctness_divergence import (
    CorrectnessRun,
    divergence_examples,
    divergence_samples,
    probe_divergence,
)
from gate.runs.early_stop import EarlyStop, LiveLooks
from gate.runs.load_phases import load_phases, request_log
from gate.runs.mirrored_outputs import mirrored_outputs, outputs_doc, outputs_from_doc
from gate.verdict.document import ScenarioDoc
from loadgen.records import RequestRecord
from loadgen.suite import CorrectnessResult, ScoreResult

T0 = 1_000_000_000


def rec(
    i: int,
    role: str,
    ttft_ms: float,
    *,
    every_s: float = 0.02,
    error: str | None = None,
    status: int = 200,
    tokens: int = 4,
) -> RequestRecord:
    sent = T0 + int(i * every_s * 1e9)
    if error is not None:
        return RequestRecord(
            i,
            role,
            sent,
            sent,
            end_ns=sent + 2_000_000,
            status=status,
            error_kind=error,  # type: ignore[arg-type]
        )
    first = sent + int(ttft_ms * 1e6)
    chunks = [first + k * 10_000_000 for k in range(tokens)]
    return RequestRecord(
        i,
        role,
        sent,
        sent,
        first_token_ns=first,
        end_ns=chunks[-1],
        status=200,
        output_tokens=tokens,
        chunk_ns=chunks,
        chunk_tokens=[1] * tokens,
    )


# --------------------------------------------------------------------------- columns


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    cut=st.integers(0, 40),
    lo=st.integers(0, 40),
    hi=st.integers(0, 45),
)
def test_concat_and_select_keep_every_request_and_gap(
    tokens: list[int], cut: int, lo: int, hi: int
) -> None:
    records = [rec(i, "r", 40.0 + i, tokens=t) for i, t in enumerate(tokens)]
    whole = columns_from_records(records, T0)
    parts = concat_columns(
        [columns_from_records(records[:cut], T0), columns_from_records(records[cut:], T0)]
    )
    for name in whole.__slots__:
        np.testing.assert_array_equal(getattr(parts, name), getattr(whole, name))
    sel = select_requests(whole, lo, hi)
    want = [r for r in records if lo <= r.request_id < hi]
    expect = columns_from_records(want, T0)
    for name in expect.__slots__:
        np.testing.assert_array_equal(getattr(sel, name), getattr(expect, name))


# --------------------------------------------------------------------------- live looks


def _feed(
    looks: LiveLooks,
    start: int,
    stop: int,
    ttft: dict[str, float],
    *,
    hold_back: tuple[str, int] | None = None,
) -> list[RequestRecord]:
    """Records of mirrored requests start..stop-1 in a completion order that runs ahead of
    the schedule (within windows of 16 requests), as a real run's does."""
    rng = random.Random(start)
    noise = np.random.default_rng(start)
    records = [
        rec(i, role, ttft[role] * float(noise.lognormal(0.0, 0.1)))
        for i in range(start, stop)
        for role in ("reference", "candidate")
    ]
    order = []
    for start in range(0, len(records), 32):
        window = records[start : start + 32]
        rng.shuffle(window)
        order.extend(window)
    for r in order:
        if hold_back is not None and (r.target, r.request_id) == hold_back:
            continue
        looks.add(r)
    return records


def _looks(
    plan: Plan, policy: Policy, hold_only: bool = False
) -> tuple[LiveLooks, list[EarlyStop]]:
    stops: list[EarlyStop] = []
    looks = LiveLooks(
        judge=SequentialJudge(plan),
        scenario="steady",
        warmup=policy.warmup_requests,
        look_every=policy.look_every,
        zero_ns=T0,
        on_stop=stops.append,
        hold_only=hold_only,
    )
    return looks, stops


async def _settle(looks: LiveLooks) -> None:
    for _ in range(500):
        if looks._task is None:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("a look never finished")


def test_a_regression_stops_at_a_look_and_the_final_judge_agrees() -> None:
    policy = Policy(look_every=100)
    plan = Plan.build(policy, {"steady": 2000})

    async def main() -> tuple[LiveLooks, list[EarlyStop], list[RequestRecord]]:
        looks, stops = _looks(plan, policy)
        records: list[RequestRecord] = []
        for chunk in range(8):  # 8 x 100 requests, a look between chunks at most
            ttft = {"reference": 40.0, "candidate": 60.0}
            records += _feed(looks, 100 * chunk, 100 * (chunk + 1), ttft)
            await _settle(looks)
            if stops:
                break
        return looks, stops, records

    looks, stops, records = asyncio.run(main())
    assert len(stops) == 1
    early = stops[0]
    assert early.reason == "hold" and "steady.ttft.p50" in early.checks
    assert early.requests == early.upto - policy.warmup_requests
    assert 100 <= early.requests < 2000  # the first look whose prefix was due
    assert "stopped early" in early.message and "failed" in early.message
    assert "steady.ttft.p50" in early.message.split("failed")[0]
    # The final judge, on exactly the prefix the look saw and under the same plan, fails the
    # same check: the verdict is the look's, not a second fixed-sample test.
    by_role = {
        role: columns_from_records([r for r in records if r.target == role], T0)
        for role in ("reference", "candidate")
    }
    arms = {
        role: select_requests(c, policy.warmup_requests, early.upto).to_arm()
        for role, c in by_role.items()
    }
    assert arms["reference"].requests == early.requests
    verdict = judge(
        [ScenarioSamples("steady", arms["reference"], arms["candidate"])],
        [],
        policy,
        plan=plan,
    )
    final = {c.id: c.decision for c in verdict.checks}
    assert looks.last is not None
    decided = [c for c in looks.last.checks if c.id in looks.last.decided]
    assert decided and all(final[c.id] == c.decision for c in decided)


def test_a_look_waits_for_the_whole_prefix() -> None:
    """A request still in flight on one engine holds the look back: judging only what came
    back would leave out the slow requests."""
    policy = Policy(look_every=50, warmup_requests=8)
    plan = Plan.build(policy, {"steady": 1000})

    async def main() -> tuple[int, int]:
        looks, _ = _looks(plan, policy)
        records = _feed(
            looks, 0, 300, {"reference": 40.0, "candidate": 40.0}, hold_back=("candidate", 20)
        )
        await _settle(looks)
        before = looks.looks
        looks.add(next(r for r in records if (r.target, r.request_id) == ("candidate", 20)))
        await _settle(looks)
        return before, looks.looks

    before, after = asyncio.run(main())
    assert before == 0 and after == 1


def test_identical_engines_do_not_stop_before_the_limit() -> None:
    """The errors test only ever rejects, so a clean scenario is never all decided early:
    it runs to its planned size (a rare new error kind can show late)."""
    policy = Policy(look_every=100, extend=0.0)
    plan = Plan.build(policy, {"steady": 592})

    async def main() -> tuple[LiveLooks, list[EarlyStop]]:
        looks, stops = _looks(plan, policy)
        for k in range(6):
            _feed(looks, 100 * k, 100 * (k + 1), {"reference": 40.0, "candidate": 40.0})
            await _settle(looks)
        return looks, stops

    looks, stops = asyncio.run(main())
    assert stops == [] and looks.looks >= 5
    assert looks.last is not None and not looks.last.hold


def test_a_scenario_that_may_extend_stops_at_its_planned_size_when_nothing_is_undecided() -> None:
    """With an extension allowed (a required check) the schedule runs past the plan, so the
    looks must end a settled scenario at the planned size themselves, with a look exactly
    there."""
    policy = Policy(look_every=100, extend=0.5, require=["ttft.p50"])
    plan = Plan.build(policy, {"steady": 592})
    assert plan.limit("steady") == 888

    async def main() -> tuple[LiveLooks, list[EarlyStop], bool]:
        looks, stops = _looks(plan, policy)
        looks.go = asyncio.get_running_loop().create_future()
        for k in range(9):
            _feed(looks, 100 * k, 100 * (k + 1), {"reference": 40.0, "candidate": 40.0})
            await _settle(looks)
            if stops:
                break
        return looks, stops, looks.go.result()

    looks, stops, extend = asyncio.run(main())
    assert extend is False  # the paused schedule is told to end at its plan
    assert len(stops) == 1
    stop = stops[0]
    # Records arrive out of order and the prefix runs past 592 between two adds, but the look
    # that decides about the extension sees exactly the planned prefix.
    assert stop.reason == "planned" and stop.planned == 592 and stop.requests == 592
    assert stop.upto == 592 + policy.warmup_requests
    assert "did not need its extension" in stop.message
    assert looks.last is not None and not looks.last.hold and not looks.last.extending


# --------------------------------------------------------------------------- load phases


def test_overload_window_comes_from_the_schedule_and_leaves_the_ramp_out() -> None:
    # phases: baseline 0-2 s, ramp 2-3 s, overload 3-5 s, after 5-9 s; one request per 50 ms
    n = 180
    phase_of = np.array(
        [0 if i < 40 else 1 if i < 60 else 2 if i < 100 else 3 for i in range(n)], np.int64
    )
    marks = [("baseline", 0.0), ("ramp", 2.0), ("overload", 3.0), ("after", 5.0)]

    def cols(role: str, slow: float) -> Columns:
        recs = [
            rec(i, role, 40.0 * (slow if 60 <= i < 100 else 1.0), every_s=0.05) for i in range(n)
        ]
        return columns_from_records(recs, T0, phase_of)

    ref, cand = cols("reference", 1.0), cols("candidate", 20.0)
    peaks, overloads = load_phases(
        "ov",
        "overload",
        {"ramp_s": 1, "before_s": 2, "overload_s": 2, "after_s": 4},
        ref,
        cand,
        marks,
    )
    assert peaks == [] and len(overloads) == 1
    o = overloads[0]
    assert (o.start_s, o.end_s) == (3.0, 5.0)
    assert len(o.reference) == n - 20  # the 20 ramp requests are left out
    inside = (o.candidate.sent_s >= 3.0) & (o.candidate.sent_s < 5.0)
    assert int(inside.sum()) == 40
    assert np.nanmedian(o.candidate.ttft_ms[inside]) > 10 * np.nanmedian(o.reference.ttft_ms)


def test_peak_goodput_uses_the_suite_slos_and_pairs_by_request() -> None:
    ref = columns_from_records([rec(i, "reference", 40.0) for i in range(50)], T0)
    # the candidate lost request 7 (a stopped run): pairs are cut to the common requests
    cand = columns_from_records(
        [
            rec(i, "candidate", 80.0) if i % 2 else rec(i, "candidate", 0, error="http_5xx")
            for i in range(50)
            if i != 7
        ],
        T0,
    )
    peaks, overloads = load_phases("pk", "peak", {"slo_ttft_ms": 60}, ref, cand, [])
    assert overloads == [] and len(peaks) == 1
    p = peaks[0]
    assert len(p.reference) == len(p.candidate) == 49
    assert p.slo.ttft_ms == 60 and p.slo.itl_ms is None
    assert p.slo.met(p.reference).all() and not p.slo.met(p.candidate).any()
    log = request_log(cand)
    assert log.error[0] == "http_5xx" and math.isnan(log.ttft_ms[0])
    assert load_phases("n", "normal", {}, ref, cand, []) == ([], [])


# --------------------------------------------------------------------------- divergence


def probe(i: int, tokens: list[str], *, error: str | None = None) -> CorrectnessResult:
    if error is not None:
        return CorrectnessResult(i, f"prompt {i}", 500, None, None, None, "", error=error)
    top = [{t: -0.1, "alt": -0.5, "far": -6.0} for t in tokens]
    return CorrectnessResult(
        i,
        f"prompt {i}",
        200,
        list(range(len(tokens))),
        [-0.1] * len(tokens),
        top,
        " ".join(tokens),
        tokens=tokens,
        prompt_token_ids=[9, 9],
    )


def test_divergence_samples_pair_the_runs_and_name_failures() -> None:
    same = ["a", "b", "c", "d"]
    run = CorrectnessRun(
        name="correctness",
        max_tokens=4,
        reference=[probe(0, same), probe(1, same), probe(2, same)],
        candidate=[
            probe(0, same),
            probe(1, ["a", "alt", "x", "y"]),
            probe(2, [], error="HTTP 500"),
        ],
        reference_loaded=[probe(0, same), probe(1, same), probe(2, same)],
        scored=[0, 1, 2],
        scores={
            "reference": [ScoreResult(i, 200, [-0.1] * 4, [{1: -0.1}] * 4) for i in range(3)],
            "candidate": [
                ScoreResult(0, 200, [-0.1] * 4, [{1: -0.1}] * 4),
                ScoreResult(1, 200, [-0.1, float("nan"), -0.1, -0.1], [{1: -0.1}] * 4),
                ScoreResult(2, 500, error="HTTP 500: Internal Server Error"),
            ],
            "loaded": [ScoreResult(i, 200, [-0.1] * 4, [{1: -0.1}] * 4) for i in range(3)],
        },
    )
    notes: list[str] = []
    data = divergence_samples(run, notes)
    assert len(data.greedy) == 2 and len(data.envelope_greedy) == 3
    assert len(data.teacher) == 2 and len(data.envelope_teacher) == 3
    assert [role for role, _ in data.failures] == ["candidate", "candidate"]
    assert notes == []
    verdict = judge([], [], Policy(), divergence=data)
    by_id = {c.id: c for c in verdict.checks}
    assert by_id["correctness.answered"].decision == "fail"
    assert by_id["correctness.finite"].decision == "fail"  # the NaN teacher-forced score
    examples = divergence_examples(run, Policy())
    assert len(examples) == 1
    ex = examples[0].to_json()
    assert ex["index"] == 1 and ex["margin"] == pytest.approx(0.4)
    assert ex["reference_tokens"] == same and ex["candidate_tokens"][1] == "alt"
    assert ex["prompt"] == "prompt 1" and not ex["outside_top_k"]


def test_an_engine_without_prompt_logprobs_leaves_free_run_only() -> None:
    same = ["a", "b"]
    run = CorrectnessRun(
        name="c",
        max_tokens=2,
        reference=[probe(0, same)],
        candidate=[probe(0, same)],
        reference_loaded=[probe(0, same)],
        scored=[0],
        scores={
            "reference": [ScoreResult(0, 200, [-0.1] * 2, [{1: -0.1}] * 2)],
            "candidate": [ScoreResult(0, 400, error="HTTP 400", supported=False)],
            "loaded": [ScoreResult(0, 200, [-0.1] * 2, [{1: -0.1}] * 2)],
        },
    )
    notes: list[str] = []
    data = divergence_samples(run, notes)
    assert data.teacher == [] and data.failures == [] and len(data.greedy) == 1
    assert "candidate does not support prompt_logprobs" in notes[0]


def test_an_undecided_look_at_the_planned_size_releases_the_extension() -> None:
    """The candidate sits on the p50 threshold, which the policy requires decided: the look at
    the planned size extends, tells the paused schedule to go on, and records no stop."""
    policy = Policy(look_every=100, extend=0.5, require=["ttft.p50"])
    plan = Plan.build(policy, {"steady": 592})

    async def main() -> tuple[LiveLooks, list[EarlyStop], bool]:
        looks, stops = _looks(plan, policy)
        looks.go = asyncio.get_running_loop().create_future()
        for k in range(6):
            _feed(looks, 100 * k, 100 * (k + 1), {"reference": 40.0, "candidate": 42.0})
            await _settle(looks)
        return looks, stops, looks.go.result()

    looks, stops, extend = asyncio.run(main())
    assert extend is True
    assert stops == []
    assert looks.last is not None and looks.last.extending


def test_closing_the_looks_never_leaves_a_paused_schedule_waiting() -> None:
    policy = Policy(look_every=100)
    plan = Plan.build(policy, {"steady": 592})

    async def main() -> bool:
        looks, _ = _looks(plan, policy)
        looks.go = asyncio.get_running_loop().create_future()
        await looks.close()
        return looks.go.result()

    assert asyncio.run(main()) is False


def _rec(role: str, rid: int, text: str, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        target=role,
        intended_ns=0,
        sent_ns=0,
        text=text,
        output_tokens=len(text),
        error_kind=None if ok else "http_5xx",
    )


def test_mirrored_outputs_pair_records_and_survive_the_document() -> None:
    """The live run compares records by request id (failed requests left out); the verdict
    document keeps the comparison, and re-judge reads back exactly what was judged."""
    records = {
        "reference": [_rec("reference", i, "abcdefgh") for i in range(300)],
        "candidate": [
            _rec("candidate", i, "abcdefgh" if i % 3 else "Xbcdefgh", ok=i != 7) for i in range(300)
        ],
    }
    live = mirrored_outputs("steady", records, early_tokens=16)
    assert live.compared == 299 and live.early == 100 and live.basis == "text"
    doc = ScenarioDoc.model_validate_json(
        ScenarioDoc(
            name="steady", duration_s=1.0, reference={}, candidate={}, outputs=outputs_doc(live)
        ).model_dump_json()
    )
    assert doc.outputs is not None
    again = outputs_from_doc("steady", doc.outputs)
    assert again == live
    policy = Policy()
    assert mirrored_output_checks([again], policy) == mirrored_output_checks([live], policy)


def _probe(i: int, ids: list[int], texts: list[str], top: list[dict[int, float]], **kw: Any) -> Any:
    return CorrectnessResult(
        i,
        f"prompt {i}",
        200,
        ids,
        [-0.1] * len(ids),
        [{t: -0.1} for t in texts],
        "".join(texts),
        tokens=texts,
        top_logprobs_by_id=top,
        **kw,
    )


def test_tokens_are_compared_by_id_where_every_entry_names_one() -> None:
    """llama.cpp's byte-fallback tokens all read "\\ufffd": by text, two different tokens are
    one and a real flip disappears (or a same token looks changed); by id they are what they
    are, and the document still shows their text."""
    fffd = "\ufffd"
    top_ref = [{163: -0.1, 205: -0.5, 7: -2.0, 8: -2.1, 9: -2.2}, {4: -0.1}]
    ref = _probe(0, [163, 4], [fffd, "a"], top_ref)
    cand = _probe(0, [205, 4], [fffd, "a"], [{205: -0.1}, {4: -0.1}])
    run = CorrectnessRun("c", 8, [ref], [cand], [ref])
    assert run.by_id
    data = divergence_samples(run, [])
    (pair,) = data.greedy
    assert pair.a.token_ids == (163, 4) and pair.b.token_ids == (205, 4)
    (probe,) = probe_divergence(run, Policy())
    assert probe.first == 0 and probe.reference_token == fffd and probe.margin == 0.4
    # without ids on every answer the run stays on text, one kind for all
    plain = _probe(0, [163, 4], [fffd, "a"], None)  # type: ignore[arg-type]
    assert not CorrectnessRun("c", 8, [ref], [plain], [ref]).by_id


def test_merged_logprob_entries_leave_a_probe_to_the_text() -> None:
    """Fewer entries than the usage's tokens (llama.cpp merges tokens that end inside a UTF-8
    character): positions do not line up, so the probe is not compared token by token, and a
    note says so; it is neither a failure nor a flip."""
    top = [{1: -0.1}, {2: -0.1}]
    ref = _probe(0, [1, 2], ["x", "y"], top, completion_tokens=2)
    merged = _probe(0, [9, 2], ["zz", "y"], [{9: -0.1}, {2: -0.1}], completion_tokens=3)
    assert ref.aligned and not merged.aligned
    run = CorrectnessRun("c", 8, [ref], [merged], [ref])
    notes: list[str] = []
    data = divergence_samples(run, notes)
    assert data.greedy == [] and data.failures == [] and run.unaligned == 1
    assert any("not compared token by token" in n for n in notes)
    assert probe_divergence(run, Policy()) == []
