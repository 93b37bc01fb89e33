"""The capacity entry's pure search (issue 33): bracketing, bisection, the confirming repeats,
the stopping rule, the step budget planned before the first step, and knobs refused by name.

Goodput as the field defines it, which the search keeps: a request is good when it meets every
SLO, inclusive (vLLM 0.32.0 `vllm/benchmarks/serve.py:661`, `all([s >= r ...])`; AIPerf
db4f6397 `aiperf/metrics/types/good_request_count_metric.py:76-80`, `record_value <=
threshold_value`), and one without the metric (failed) is not (AIPerf ibid. :90-91; vLLM
:636-637 leaves a failed request out of the good count). The peers sweep fixed rates spaced
evenly between a serial and a saturated run (vLLM `vllm/benchmarks/sweep/serve_workload.py:180`,
guidellm ee7a7745 `src/guidellm/benchmark/profiles/sweep.py:128`, both `np.linspace`); the
search here brackets and bisects instead, so its resolution is a knob, not a grid.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from loadgen import suite
from loadgen.brackets import Bracket, bracket, monotone_votes, passed
from loadgen.suite.capacity import Capacity, RateSearch

ROLES = ("reference", "candidate")


def drive(
    search: RateSearch, goodput: Callable[[str, float, int], float]
) -> list[tuple[float, str]]:
    """Run the search against engines whose goodput at a rate is `goodput(role, rate, i)` (i:
    the step's index), as the gate would; returns the (rate, stage) offered."""
    offered = []
    while (nxt := search.next()) is not None:
        rate, stage = nxt
        i = len(search.steps)
        search.record(rate, stage, {r: goodput(r, rate, i) for r in ROLES})
        offered.append((rate, stage))
    return offered


def knee(capacities: dict[str, float]) -> Callable[[str, float, int], float]:
    return lambda role, rate, _i: 1.0 if rate <= capacities[role] else 0.6


def entry(**knobs: object) -> Capacity:
    base = {"start_rate": 10.0, "max_rate": 200.0, "growth": 2.0, "resolution": 0.03}
    got = suite.get("capacity", **(base | knobs))
    assert isinstance(got, Capacity)
    return got


def test_goodput_meets_the_target_inclusively() -> None:
    assert passed(0.95, 0.95) and passed(1.0, 0.95)
    assert not passed(0.9499, 0.95)


def test_the_bracket_is_where_the_monotone_fit_of_the_votes_crosses_one_half() -> None:
    assert bracket([], 0.95) == Bracket(None, None)
    assert bracket([(10, 1.0), (20, 1.0), (40, 0.5)], 0.95) == Bracket(20, 40)
    assert bracket([(10, 1.0), (20, 1.0)], 0.95) == Bracket(20, None)  # never missed
    assert bracket([(10, 0.2), (20, 1.0)], 0.95) == Bracket(None, 10)  # missed at the start
    # A lone miss below passes (a host pause, a burst) stands against one pass above it (a
    # tie is a miss) and is outvoted by two, however deep it was: a step is one vote.
    assert bracket([(10, 1.0), (20, 0.9), (30, 1.0), (40, 0.5)], 0.95) == Bracket(10, 20)
    assert bracket([(10, 1.0), (20, 0.1), (30, 1.0), (35, 1.0), (40, 0.5)], 0.95) == Bracket(35, 40)
    # A miss its neighbour confirms stays a miss: everything from it up fails.
    assert bracket([(10, 1.0), (20, 0.9), (30, 0.9), (35, 1.0), (40, 0.5)], 0.95) == Bracket(10, 20)
    # A lone lucky pass above misses cannot lift the bracket, however close to the target.
    assert bracket([(10, 1.0), (20, 0.94), (30, 0.97), (40, 0.5)], 0.95) == Bracket(10, 20)
    # Two steps at one rate: one miss makes the rate a miss (a confirming repeat can lower
    # lo, never raise it).
    assert bracket([(10, 1.0), (20, 1.0), (20, 0.94), (40, 0.5)], 0.95) == Bracket(10, 20)
    assert bracket([(10, 1.0), (20, 1.0), (20, 0.96), (40, 0.5)], 0.95) == Bracket(20, 40)


def test_the_vote_fit_is_non_increasing_and_keeps_the_share_of_votes() -> None:
    measured = [(10, 1.0), (20, 0.7), (30, 0.99), (30, 1.0), (40, 0.2), (50, 0.96)]
    fit = monotone_votes(measured, 0.95)
    rates = sorted(fit)
    assert all(fit[a] >= fit[b] for a, b in itertools.pairwise(rates))
    # votes 1 | 0, 1, 1 | 0, 1: the middle pool keeps 2 of 3, the last 1 of 2
    assert fit[10] == 1.0
    assert fit[20] == fit[30] == pytest.approx(2 / 3)
    assert fit[40] == fit[50] == pytest.approx(0.5)


def test_bracket_estimate_and_width() -> None:
    assert Bracket(20, 40).width == 2.0
    assert Bracket(20, 40).estimate == pytest.approx(math.sqrt(800))
    assert Bracket(20, None).width == math.inf and Bracket(20, None).estimate == 20
    assert Bracket(None, 10).estimate == 10


def test_ramp_brackets_then_bisection_resolves_then_repeats_confirm() -> None:
    e = entry()
    search = e.search(ROLES)
    offered = drive(search, knee({"reference": 50.0, "candidate": 42.5}))
    stages = [s for _, s in offered]
    # The ramp runs until both engines missed once: 10, 20, 40, 80 (both miss at 80).
    assert [r for r, s in offered if s == "ramp"] == [10, 20, 40, 80]
    assert stages.index("bisect") == 4 and stages[-1] == "confirm"
    for role, cap in (("reference", 50.0), ("candidate", 42.5)):
        b = search.bracket(role)
        assert b.lo is not None and b.hi is not None
        assert b.lo <= cap < b.hi  # the true capacity lies in the bracket
        assert b.width <= 1.03 + 1e-9  # within the resolution
        # Confirmed: lo measured 1 + repeats times.
        assert sum(1 for r, _ in offered if r == b.lo) == 1 + e.repeats
    assert search.stopped == "every engine's capacity was bracketed and confirmed"
    assert len(offered) <= e.max_steps()


def test_every_rate_is_offered_to_both_engines() -> None:
    search = entry().search(ROLES)
    drive(search, knee({"reference": 30.0, "candidate": 60.0}))
    assert all(set(s.goodput) == set(ROLES) for s in search.steps)
    with pytest.raises(ValueError, match="missing"):
        search.record(10.0, "ramp", {"reference": 1.0})


def test_a_confirming_miss_lowers_the_bracket_and_bisection_resumes() -> None:
    search = entry().search(ROLES)
    caps = {"reference": 50.0, "candidate": 42.5}
    missed_at: list[float] = []
    while (nxt := search.next()) is not None:
        rate, stage = nxt
        got = {r: 1.0 if rate <= caps[r] else 0.6 for r in ROLES}
        if stage == "confirm" and rate == search.bracket("candidate").lo and not missed_at:
            got["candidate"] = 0.9  # a noisy miss at the candidate's knee
            missed_at.append(rate)
        search.record(rate, stage, got)
    assert missed_at
    b = search.bracket("candidate")
    assert b.hi is not None and b.lo is not None
    assert b.hi <= missed_at[0]  # a miss of two steps at a rate: the bracket moved below it
    stages = [s.stage for s in search.steps]
    after = stages[stages.index("confirm") :]
    assert "bisect" in after or "budget" in search.stopped  # bisection resumed below the miss


FLOOR = 0.92  # 1 - the default capacity_tolerance


def interval(search: RateSearch) -> tuple[float, float]:
    r, c = search.bracket("reference"), search.bracket("candidate")
    assert None not in (r.lo, r.hi, c.lo, c.hi)
    return c.lo / r.hi, c.hi / r.lo  # type: ignore[operator]


@pytest.mark.parametrize(
    ("candidate", "decided"), [(50.0, "pass"), (42.5, "fail"), (47.5, "pass"), (44.0, "fail")]
)
def test_with_a_boundary_the_candidate_is_probed_a_tolerance_below_the_references_knee(
    candidate: float, decided: str
) -> None:
    """The reference's bracket is bisected first; then, while the ratio interval straddles the
    floor, the candidate is offered floor x hi_r (a pass there decides pass) or just under
    floor x lo_r (a miss there decides fail), rates a tolerance away from its own knee when
    the loss is zero or well past the tolerance. Every later vote keeps the decision: the
    search's steps stay inside the brackets, where they only narrow them."""
    search = entry().search(ROLES, boundary=FLOOR)
    offered = drive(search, knee({"reference": 50.0, "candidate": candidate}))
    stages = [s for _, s in offered]
    first_bisect = stages.index("bisect")
    ref_done = next(
        i
        for i in range(first_bisect, len(offered))
        if search.resolved(bracket(search.measured("reference")[: i + 1], 0.95))
    )
    assert all(s == "bisect" for s in stages[first_bisect : ref_done + 1])
    if candidate != 50.0:  # A/A: measured at the reference's rates, decided without a probe
        assert "decide" in stages and stages.index("decide") > ref_done
    r = search.bracket("reference")
    assert r.lo is not None and r.hi is not None
    probes = [rate for rate, s in offered if s == "decide"] or [FLOOR * r.hi * 1.002]
    assert probes[0] == pytest.approx(FLOOR * r.hi * 1.002) or probes[0] == pytest.approx(
        FLOOR * r.lo * 0.998
    )
    low, high = interval(search)
    assert (high < FLOOR) if decided == "fail" else (low >= FLOOR), (low, high, offered)
    assert search.stopped == "every engine's capacity was bracketed and confirmed"
    assert len(offered) <= entry().max_steps()


def test_a_probe_is_offered_only_inside_a_bracket_and_once() -> None:
    """Decided, or every decisive rate outside the brackets or tried: no probe."""
    search = entry().search(ROLES, boundary=FLOOR)
    for rate, ref, cand in [(40.0, 1.0, 1.0), (44.0, 1.0, 0.5), (50.0, 1.0, 0.5), (52.0, 0.5, 0.5)]:
        search.record(rate, "ramp", {"reference": ref, "candidate": cand})
    r, c = search.bracket("reference"), search.bracket("candidate")
    assert (r.lo, r.hi, c.lo, c.hi) == (50.0, 52.0, 40.0, 44.0)
    assert search._decisive(r, c, FLOOR) is None  # 44 / 50 = 0.88 < 0.92: fail, decided
    wide = Bracket(40.0, 49.0)  # [40/52, 49/50] = [0.77, 0.98]: undecided
    first = search._decisive(r, wide, FLOOR)
    assert first == round(FLOOR * 52.0 * 1.002, 6)  # just over: a pass there is a pass
    assert first is not None
    search.record(first, "decide", {"reference": 1.0, "candidate": 1.0})
    assert search._decisive(r, wide, FLOOR) == round(FLOOR * 50.0 * 0.998, 6)
    # only inside the candidate's bracket: here both rates are above it
    assert search._decisive(r, Bracket(40.0, 45.0), FLOOR) is None


def test_a_probe_decides_the_check_as_the_judge_reads_the_document() -> None:
    """Review: a pass at exactly floor x hi_r made lo_c / hi_r equal the floor, and after the
    document's rounding of rates it fell under it half the time: a 5% loss with knees at
    58.2876 and 55.3733 (no noise) stayed undecided where the old order passed. The probes
    sit strictly past the boundary and are rounded as the document stores rates."""
    from gate.analysis.capacity import CapacitySearch, CapacityStep, EngineStep, capacity_check
    from gate.analysis.policy import Policy

    for ref_knee, cand_knee in [(58.2876, 55.3733), (50.0, 47.5), (50.0, 45.5), (33.3, 29.0)]:
        search = entry().search(ROLES, boundary=FLOOR)
        drive(search, knee({"reference": ref_knee, "candidate": cand_knee}))
        steps = [
            CapacityStep(
                round(s.rate, 6),
                s.stage,
                {r: EngineStep(100, round(100 * s.goodput[r])) for r in ROLES},
            )
            for s in search.steps
        ]
        doc = CapacitySearch("capacity", search.target, search.resolution, steps)
        check = capacity_check(doc, Policy())
        want = "pass" if cand_knee / ref_knee >= 0.95 else "fail"  # none within 3% of 0.92
        assert check.decision == want, (ref_knee, cand_knee, check.interval)


def test_an_engine_that_never_misses_is_censored_at_max_rate() -> None:
    search = entry(max_rate=100.0).search(ROLES)
    offered = drive(search, knee({"reference": 1e9, "candidate": 30.0}))
    assert [r for r, s in offered if s == "ramp"] == [10, 20, 40, 80, 100]
    assert search.bracket("reference") == Bracket(100.0, None)
    assert search.resolved(search.bracket("reference"))


def test_an_engine_that_misses_at_the_start_is_followed_down_and_bracketed() -> None:
    """A candidate that collapsed below the start rate (review: a 90% loss left at Bracket(None,
    start) gave the interval [0, start/lo_ref], which straddled the tolerance and continued):
    the search offers start/growth^k until it passes, then bisects as anywhere else."""
    search = entry().search(ROLES)
    offered = drive(search, knee({"reference": 50.0, "candidate": 3.0}))
    assert [r for r, s in offered if s == "ramp" and r < 10] == [5.0, 2.5]
    b = search.bracket("candidate")
    assert b.lo is not None and b.hi is not None and b.lo <= 3.0 < b.hi
    assert b.width <= 1.03 + 1e-9
    assert search.stopped == "every engine's capacity was bracketed and confirmed"


def test_an_engine_below_the_floor_is_said_to_be_below_the_range() -> None:
    search = entry().search(ROLES)
    drive(search, knee({"reference": 50.0, "candidate": 0.5}))
    assert search.bracket("candidate") == Bracket(None, 1.25)  # 10 / 2^3: the floor
    assert "candidate missed the target at the search's floor of 1.25 req/s" in search.stopped


def test_the_search_stops_at_its_step_budget() -> None:
    e = entry()
    search = e.search(ROLES)
    # An engine whose goodput flips at random would never settle: the budget ends it.
    flip = lambda role, rate, i: 1.0 if (i * 7 + int(rate)) % 3 else 0.5  # noqa: E731
    offered = drive(search, flip)
    assert len(offered) <= e.max_steps()
    assert search.stopped  # says why


def test_the_budget_is_planned_by_arithmetic() -> None:
    e = entry(start_rate=20.0, max_rate=200.0, growth=1.5, resolution=0.03, step_s=2.0)
    ramp = e.ramp_rates()
    assert ramp[0] == 20.0 and ramp[-1] == 200.0 and len(ramp) == 7
    # 1.5 -> within 1.03 takes ceil(log2(ln 1.5 / ln 1.03)) = 4 bisections
    assert e.bisect_steps() == 4
    assert e.max_steps() == len(ramp) + 2 * 4 + 2 * e.repeats + 2 * (1 + e.repeats)
    size = e.plan()
    assert size.duration_s == e.max_steps() * 2.0 and not size.exact
    # Worst case: every ramp step, every other step at the top rate.
    assert size.requests >= sum(r * 2.0 for r in ramp)
    assert size.requests <= sum(r * 2.0 + 8 for r in ramp) + (e.max_steps() - 7) * (400 + 8)


def test_a_step_is_seeded_lasts_step_s_and_sends_exactly_its_count() -> None:
    e = entry(step_s=2.0, prompt_tokens=16, max_tokens=8)
    a, b = e.step(40.0, seed=3), e.step(40.0, seed=3)
    assert a.offsets_s is not None and b.offsets_s is not None
    assert list(a.offsets_s) == list(b.offsets_s) and a.requests == b.requests
    assert float(a.offsets_s[-1]) < 2.0
    # exactly rate x step_s requests at every rate and seed: the rate measured is the one
    # offered, whatever the draw
    for rate in (10.0, 40.0, 41.7):
        for seed in range(5):
            assert len(e.step(rate, seed).requests) == round(rate * 2.0) == e.step_requests(rate)
    assert e.build(seed=3).offsets_s is not None
    # steps of one pattern share their gaps but never their prompts: a search's later step
    # must not find its prompts in an engine's prefix cache (loadgen/prompts.py)
    x, y = e.step(40.0, seed=11, pattern=500), e.step(40.0, seed=12, pattern=500)
    assert x.offsets_s is not None and y.offsets_s is not None
    assert list(x.offsets_s) == list(y.offsets_s)
    assert not {r.prompt for r in x.requests} & {r.prompt for r in y.requests}
    # a search's steps: one pattern of gaps for every step, a repeat at a rate included (the
    # same offsets, new prompts), and at another rate the same draws rescaled
    first, again = e.search_step(40.0, seed=7_000, index=3), e.search_step(40.0, 7_000, 9)
    assert first.offsets_s is not None and again.offsets_s is not None
    assert list(first.offsets_s) == list(again.offsets_s)
    assert not {r.prompt for r in first.requests} & {r.prompt for r in again.requests}
    slower = e.search_step(20.0, seed=7_000, index=4).offsets_s
    assert slower is not None
    pairs = zip(first.offsets_s[1:6], slower[1:6], strict=True)
    ratios = {round(float(a / b), 9) for a, b in pairs}
    assert len(ratios) == 1 and ratios != {1.0}
    # the budget is exact arithmetic on those counts
    assert e.plan().requests == sum(e.step_requests(r) for r in e.ramp_rates()) + (
        e.max_steps() - len(e.ramp_rates())
    ) * e.step_requests(e.ramp_rates()[-1])


@pytest.mark.parametrize(
    ("knobs", "field", "words"),
    [
        ({"slo": {"ttft": 100}}, "slo.ttft", "not an objective"),
        ({"slo": {"ttft_ms": -1}}, "slo.ttft_ms", "finite number > 0"),
        ({"slo": {}}, "slo", "at least one of"),
        ({"goodput": 1.5}, "goodput", "at most 1"),
        ({"goodput": 0}, "goodput", "> 0"),
        ({"growth": 1.0}, "growth", "> 1"),
        ({"resolution": 0.0001}, "resolution", ">= 0.005"),
        ({"repeats": 9}, "repeats", "from 0 to 5"),
        ({"step_s": "2"}, "step_s", "must be a number"),
        ({"require_decided": "yes"}, "require_decided", "true or false"),
    ],
)
def test_bad_knobs_are_named(knobs: dict[str, object], field: str, words: str) -> None:
    problems = suite.knob_problems("capacity", knobs)
    assert problems and problems[0][0] == field and words in problems[0][1], problems
    with pytest.raises(suite.KnobError) as err:
        suite.get("capacity", **knobs)
    assert err.value.knob == field


def test_max_rate_below_start_rate_is_refused() -> None:
    with pytest.raises(suite.KnobError, match="must be at least start_rate") as err:
        suite.get("capacity", start_rate=50.0, max_rate=10.0)
    assert err.value.knob == "max_rate"
