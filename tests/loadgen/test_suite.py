"""The scenario suite builds reproducibly; probes and greedy checks run against the real sim."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from loadgen import Target
from loadgen.schedule import PlannedSize
from loadgen.suite import (
    SUITE,
    BuiltScenario,
    Correctness,
    Probe,
    first_divergence,
    get,
    knobs,
    run_correctness,
    run_probes,
)


@pytest.mark.parametrize("name", list(SUITE))
def test_every_entry_builds_reproducibly(name: str) -> None:
    a = get(name).build(3)
    b = get(name).build(3)
    assert isinstance(a, BuiltScenario)
    assert a.name == name
    assert a.requests
    assert (a.offsets_s is None) != (a.concurrency is None)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    if a.offsets_s is not None:
        assert b.offsets_s is not None
        np.testing.assert_array_equal(a.offsets_s, b.offsets_s)
        assert len(a.offsets_s) == len(a.requests)


def test_overrides_map_onto_fields() -> None:
    peak = get("peak", rate=40, requests=50).build(1)
    assert len(peak.requests) == 50
    assert get("peak").build(1, rate=5, requests=10).offsets_s is not None
    with pytest.raises(ValueError, match="unknown setting"):
        get("peak", rat=40)
    assert "overload_rate" in knobs("overload")
    with pytest.raises(ValueError, match="unknown"):
        get("nope")


def test_recovery_has_a_marked_recovery_phase() -> None:
    built = get("recovery", before_s=2, overload_s=2, after_s=3, rate=5, overload_rate=50).build(1)
    assert built.phases is not None
    assert [p.name for p in built.phases.phases] == ["baseline", "overload", "recovery"]
    counts = np.bincount(built.phases.phase_index, minlength=3)
    assert counts[1] > counts[0]  # the overload phase is denser
    overload = get("overload", ramp_s=1).build(1)
    assert overload.phases is not None
    assert [p.name for p in overload.phases.phases] == ["baseline", "ramp", "overload", "after"]


def test_probes_and_correctness_against_the_sim(sim: Any) -> None:
    async def main(url: str) -> tuple[Any, Any, Any]:
        target = Target("t", url)
        probes = await run_probes(target)
        checks = await run_correctness(target, scenario=Correctness(probes_count=2, max_tokens=6))
        return (
            probes,
            checks,
            await run_correctness(target, scenario=Correctness(probes_count=2, max_tokens=6)),
        )

    with sim() as url:
        probes, checks, again = asyncio.run(main(url))
    by_name = {p.name: p for p in probes}
    expected = {
        "completions", "completions_stream", "chat", "chat_stream", "stream_usage",
        "stop_sequence", "max_tokens_1", "max_tokens_large", "logprobs", "chat_logprobs",
        "seed", "unicode", "json_format", "tool_call", "long_prompt", "over_context",
    }  # fmt: skip
    assert expected <= set(by_name)
    for name in expected - {"json_format"}:  # the toy sim ignores response_format
        assert by_name[name].ok, (name, by_name[name].problems)
    assert by_name["over_context"].status == 400
    assert all(p.status is not None and p.elapsed_ms > 0 for p in probes)
    assert len(checks) == 2
    for c, d in zip(checks, again, strict=True):
        assert c.error is None
        assert c.token_ids is not None and len(c.token_ids) == 6
        assert c.logprobs is not None and len(c.logprobs) == 6
        assert c.top_logprobs is not None and all(len(t) >= 1 for t in c.top_logprobs)
        assert first_divergence(c, d) is None  # greedy: the same engine agrees with itself


def test_correctness_probes_on_the_chat_api_for_an_engine_without_completions(sim: Any) -> None:
    """An engine that serves only chat gets the greedy probes as one user message with OpenAI's
    `logprobs: true, top_logprobs: k`; the answer's `logprobs.content` list is read as on
    completions, and the same greedy prompt agrees with itself."""
    cfg = Correctness(probes_count=2, max_tokens=6, top_logprobs=3)

    async def main(url: str) -> tuple[Any, Any]:
        target = Target("t", url)
        first = await run_correctness(target, scenario=cfg, api="chat")
        return first, await run_correctness(target, scenario=cfg, api="chat", concurrent=True)

    with sim() as url:
        checks, again = asyncio.run(main(url))
    assert len(checks) == 2
    for c, d in zip(checks, again, strict=True):
        assert c.error is None and c.status == 200
        assert c.text and c.logprobs is not None and len(c.logprobs) == 6
        assert c.top_logprobs is not None and all(len(t) == 3 for t in c.top_logprobs)
        assert first_divergence(c, d) is None


def test_a_context_beyond_the_cap_gets_no_long_prompt_probes(sim: Any) -> None:
    """The long prompts are sized to what the engine reports, up to the caller's cap: the sim
    reports 4096 tokens, so with a cap of 1024 no prompt of its size is built or sent."""

    async def main(url: str) -> tuple[set[str], set[str]]:
        target = Target("t", url)
        capped = await run_probes(target, max_context=1024)
        full = await run_probes(target, max_context=8192)
        return {p.name for p in capped}, {p.name for p in full}

    with sim("--max-model-len", "4096") as url:
        capped, full = asyncio.run(main(url))
    assert {"long_prompt", "over_context"} <= full
    assert not {"long_prompt", "over_context"} & capped
    assert "completions" in capped


def test_probe_failures_are_results(stream_server: Any) -> None:
    async def main() -> Any:
        async with stream_server() as server:
            target = Target("t", server.url)
            bad = [
                Probe("refused", "completions", {"x_scenario": "status_500"}),
                Probe("stream", "completions", {"x_scenario": "no_done", "max_tokens": 2}, True),
            ]
            return await run_probes(target, bad)

    refused, stream = asyncio.run(main())
    assert refused.status == 500 and not refused.ok and refused.well_formed
    assert stream.status == 200 and not stream.well_formed
    assert any("[DONE]" in p for p in stream.problems)


# -- planned sizes: arithmetic that must agree with what build() draws ------------------------

ARRIVAL = st.sampled_from(["poisson", "constant", "gamma"])


@st.composite
def steady_knobs(draw: st.DrawFn) -> dict[str, Any]:
    knobs: dict[str, Any] = {
        "arrival": draw(ARRIVAL),
        "rate": draw(st.floats(0.5, 200.0)),
        "burstiness": draw(st.floats(0.2, 5.0)),
        "prompt_tokens": draw(st.integers(2, 48)),
        "max_tokens": draw(st.integers(1, 64)),
    }
    if draw(st.booleans()):
        knobs["requests"] = draw(st.integers(1, 3_000))
    else:
        knobs["duration_s"] = draw(st.floats(0.05, 3_000.0 / knobs["rate"]))
    return knobs


@st.composite
def phased_knobs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "arrival": draw(ARRIVAL),
        "rate": draw(st.floats(0.0, 40.0)),
        "overload_rate": draw(st.floats(0.0, 120.0)),
        "before_s": draw(st.floats(0.1, 10.0)),
        "overload_s": draw(st.floats(0.1, 10.0)),
        "after_s": draw(st.floats(0.1, 10.0)),
        "ramp_s": draw(st.sampled_from([0.0, 0.5, 3.0])),
        "prompt_tokens": draw(st.integers(2, 48)),
    }


def _agrees(size: PlannedSize, built: BuiltScenario, knobs: dict[str, Any]) -> None:
    n = len(built.requests)
    burstiness = float(knobs.get("burstiness", 1.0))
    if size.exact:
        assert size.requests == n
    else:  # a random count: within six of its standard deviations (plus the first send)
        sd = math.sqrt(max(size.requests, 1) / min(1.0, burstiness))
        assert abs(n - size.requests) <= 6 * sd + 2, (size, n)
    if built.offsets_s is None or not n:
        return
    assert size.duration_s is not None
    last = float(built.offsets_s[-1])
    if built.phases is not None or "duration_s" in knobs:
        assert last < size.duration_s  # every send inside the window
    elif knobs["arrival"] == "constant":
        assert last == size.duration_s  # (n - 1) / rate, to the bit
    elif n > 1:  # the expected last send of a count: a sum of n - 1 random gaps
        # Gamma gaps of shape b (1: Poisson) and mean 1/rate sum to Gamma((n - 1) b); its
        # 1e-9 quantiles bound the last send exactly (a normal bound of six standard
        # deviations fails for a few very bursty gaps: their sum is skewed).
        shape = (n - 1) * (1.0 if knobs["arrival"] == "poisson" else burstiness)
        scale = (n - 1) / knobs["rate"] / shape
        lo, hi = stats.gamma.ppf([1e-9, 1 - 1e-9], shape, scale=scale)
        assert lo <= last <= hi, (size, last, lo, hi)


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(["normal", "peak"]), knobs=steady_knobs(), seed=st.integers(0, 99))
def test_suite_size_is_arithmetic(name: str, knobs: dict[str, Any], seed: int) -> None:
    """plan() is arithmetic on the knobs, and it is what build() draws: exactly for a count or
    constant arrivals, within the count's own noise for a Poisson or gamma duration."""
    size = get(name, **knobs).plan()
    built = get(name, **knobs).build(seed)
    _agrees(size, built, knobs)
    if "requests" in knobs:
        assert size.exact and size.requests == knobs["requests"]
    elif knobs["arrival"] == "constant":
        assert size.exact


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["overload", "recovery"]), knobs=phased_knobs(), seed=st.integers(0, 99)
)
def test_phased_suite_size_is_arithmetic(name: str, knobs: dict[str, Any], seed: int) -> None:
    size = get(name, **knobs).plan()
    built = get(name, **knobs).build(seed)
    assert built.phases is not None
    _agrees(size, built, knobs)
    assert size.duration_s == pytest.approx(built.phases.duration_s)
    if knobs["arrival"] == "constant":
        assert size.exact


@pytest.mark.parametrize(
    ("name", "knobs"),
    [("compatibility", {}), ("compatibility", {"max_model_len": 64}), ("correctness", {})]
    + [("correctness", {"probes_count": n}) for n in (1, 7, 40)],
)
def test_probe_suite_sizes_are_what_build_gives(name: str, knobs: dict[str, Any]) -> None:
    size = get(name, **knobs).plan()
    assert size.exact and size.duration_s is None
    assert size.requests == len(get(name, **knobs).build(0).requests)


KNOB_VALUES: dict[str, list[Any]] = {
    "rate": [-1.0, 0.0, float("nan"), "fast", True, 5.0, 50.0],
    "requests": [0, -3, 1.5, None, 1, 40, 10**8],
    "duration_s": [None, None, -1.0, 0.0, 2.0],
    "arrival": ["poisson", "constant", "bogus"],
    "burstiness": [0.0, 0.5, 1.0],
    "prompt_tokens": [0, 2, 16, "long", 1.5],
    "extra": [{}, {"seed": 1}, "not-a-mapping", 5],
}


@settings(max_examples=150, deadline=None)
@given(
    knobs=st.fixed_dictionaries(
        {}, optional={k: st.sampled_from(v) for k, v in KNOB_VALUES.items()}
    )
)
def test_plan_refuses_exactly_what_build_refuses(knobs: dict[str, Any]) -> None:
    """Bad knobs give the same error from plan() as from build(), so validating a spec by
    arithmetic says what building it would have said."""

    def outcome(call: Any) -> str:
        try:
            call()
        except (ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    planned = outcome(lambda: get("normal", **knobs).plan())
    built = outcome(lambda: get("normal", **knobs).build(0))
    assert planned == built


# -- knob checks: every knob of every entry has a type and a bound -----------------------------


def test_every_knob_of_every_entry_has_a_check() -> None:
    from loadgen.suite import RULES

    assert set(RULES) == set(SUITE)
    for name in SUITE:
        assert set(RULES[name]) == set(knobs(name)), name


def test_entries_refuse_bad_knobs_by_name() -> None:
    from loadgen.prompts import LengthDist
    from loadgen.suite import KnobError

    with pytest.raises(KnobError, match=r"^rate: must be a number, got '1e9'$") as info:
        get("normal", rate="1e9")
    assert info.value.knob == "rate"
    with pytest.raises(KnobError, match=r"burstiness: must be a finite number >= 0\.05"):
        get("peak").build(0, burstiness=1e-300)
    with pytest.raises(KnobError, match=r"extra\.n: not allowed"):
        get("overload").plan(extra={"n": 2})
    with pytest.raises(KnobError, match="max_model_len: must be an integer from 1"):
        get("compatibility", max_model_len=-3)
    with pytest.raises(KnobError, match="teacher_forced: must be true or false"):
        Correctness(teacher_forced=1)  # type: ignore[arg-type]
    # From Python, a length distribution is a token knob's other form; its maximum is bounded.
    dist = LengthDist("lognormal", 64, 0.5, 1, 256)
    built = get("normal", requests=20, max_tokens=dist, prompt_tokens=dist).build(0)
    assert all(1 <= r.max_tokens <= 256 for r in built.requests)
    with pytest.raises(KnobError, match="maximum must be an integer <= 1000000"):
        get("normal", max_tokens=LengthDist("fixed", 8, 0, 1, 10**7))
    # the defaults pass their own checks
    for name in SUITE:
        get(name)


def test_a_knob_is_quoted_short_whatever_it_is() -> None:
    from loadgen.suite import KnobError

    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    for value in ["x" * 100_000, 10**5000, deep, {str(i): i for i in range(10_000)}]:
        with pytest.raises(KnobError) as info:
            get("normal", rate=value)
        assert len(str(info.value)) < 120


def test_nesting_depth_is_counted_without_recursion() -> None:
    from loadgen.suite import nesting_depth

    assert nesting_depth("x", 4) == 0
    assert nesting_depth({"stop": ["a"]}, 4) == 2
    assert nesting_depth([{}, [[[]]]], 4) == 4
    deep: Any = 0
    for _ in range(200_000):
        deep = {"a": deep}
    assert nesting_depth(deep, 4) == 5  # stops counting past the limit


def test_asking_tokens_by_id_is_the_gates_choice_never_a_specs() -> None:
    """`tokens_by_id` is set by the gate when both engines name tokens by id (probes.adapt_to);
    a spec that set it against an engine answering text would make every position differ."""
    assert "tokens_by_id" not in knobs("correctness")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) tokens_by_id"):
        get("correctness", tokens_by_id=True)
