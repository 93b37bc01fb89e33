"""Whatever a caller writes in a suite scenario, a spec the gate accepts (its validation, then
the operator's caps) builds only request bodies inside the caps: max_tokens at most the cap,
one completion per request, and the keys the gate sets (model, prompt or messages, stream,
stream_options, max_tokens) exactly what it set."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gate.core.errors import SpecError
from gate.core.limits import Limits
from gate.spec import parse_spec, spec_limit_problems
from loadgen import suite as catalogue
from loadgen.client import GATE_SET_KEYS, RequestSpec, Target, request_body

LIMITS = Limits(max_scenario_requests=150, max_gate_requests=1_000, max_output_tokens=512)
BASE: dict[str, Any] = {
    "name": "t",
    "model": "the-model",
    "reference": {"url": "http://127.0.0.1:8001"},
    "candidate": {"url": "http://127.0.0.1:8002"},
}
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}

HOSTILE = st.sampled_from(
    ["1e9", "64", True, None, float("nan"), float("inf"), 10**400, -5, 0, 1e-300, [1, 2],
     {"a": 1}, [["n", 64]], 2**64, 1.5]
)  # fmt: skip
TEXT = st.text(max_size=12)
ANY_VALUE = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    TEXT,
    st.lists(TEXT, max_size=10),
    st.dictionaries(TEXT, st.integers(), max_size=2),
    st.none(),
)
EXTRA_KEYS = st.sampled_from(
    [*catalogue.EXTRA_ALLOWED, *catalogue.EXTRA_REFUSED, "logit_bias", "response_format", "x"]
)
HONEST_EXTRA = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0.0, 2.0),
        "top_p": st.floats(0.01, 1.0),
        "seed": st.integers(0, 2**32),
        "stop": st.lists(TEXT, max_size=8),
        "ignore_eos": st.booleans(),
        "logprobs": st.integers(0, 20),
    },
)
EXTRA = st.one_of(
    HONEST_EXTRA,
    st.dictionaries(EXTRA_KEYS, ANY_VALUE, max_size=5),
    st.dictionaries(st.sampled_from(list(catalogue.EXTRA_ALLOWED)), ANY_VALUE, max_size=4),
    st.lists(st.tuples(EXTRA_KEYS, ANY_VALUE), max_size=3),
    HOSTILE,
)


def knob(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly values of the right type (some out of bounds), else anything at all."""
    return st.one_of(valid, valid, valid, HOSTILE, ANY_VALUE)


SECONDS = st.floats(0.0, 3.0)
COMMON = {
    "arrival": st.sampled_from(["poisson", "constant", "gamma", "bogus"]),
    "prompt_tokens": st.integers(0, 64),
    "max_tokens": st.integers(0, 2_000),
}
STEADY = {
    "rate": st.floats(0.0, 3_000.0),
    "requests": st.integers(0, 200),
    "duration_s": SECONDS,
    "burstiness": st.floats(0.0, 5.0),
    **COMMON,
}
PHASED = {
    "rate": st.floats(0.0, 60.0),
    "overload_rate": st.floats(0.0, 100.0),
    "before_s": SECONDS,
    "overload_s": SECONDS,
    "after_s": SECONDS,
    "ramp_s": SECONDS,
    **COMMON,
}
SLO = st.floats(0.0, 1_000.0)
KNOBS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "normal": STEADY,
    "peak": {**STEADY, "slo_ttft_ms": SLO, "slo_itl_ms": SLO},
    "overload": PHASED,
    "recovery": PHASED,
    "compatibility": {"max_model_len": st.integers(-5, 100)},
    "correctness": {
        "probes_count": st.integers(0, 20),
        "max_tokens": st.integers(0, 2_000),
        "top_logprobs": st.integers(0, 30),
        "envelope_load": st.integers(-1, 8),
    },
}


@st.composite
def scenario(draw: st.DrawFn) -> dict[str, Any]:
    """A suite scenario: values of the right types (some out of bounds) with an honest or a
    hostile extra, or (hostile) anything at all in any knob."""
    name = draw(st.sampled_from(list(KNOBS)))
    hostile = draw(st.booleans())
    strategies = {k: knob(v) if hostile else v for k, v in KNOBS[name].items()}
    if name not in ("compatibility", "correctness"):
        strategies["extra"] = EXTRA if hostile else HONEST_EXTRA
    knobs = draw(st.fixed_dictionaries({}, optional=strategies))
    if draw(st.booleans()):
        return {"suite": name, "settings": knobs}  # the explicit form
    return {"suite": name, **knobs}


def _check_body(body: dict[str, Any], req: RequestSpec, target: Target) -> None:
    assert body["model"] == target.model == BASE["model"]
    assert body["stream"] is True
    assert body["stream_options"] == STREAM_OPTIONS
    assert body["max_tokens"] == req.max_tokens
    assert isinstance(req.max_tokens, int) and 1 <= req.max_tokens <= LIMITS.max_output_tokens
    if target.api == "chat":
        assert body["messages"] == [{"role": "user", "content": req.prompt}]
        assert "prompt" not in body
    else:
        assert body["prompt"] == req.prompt
        assert "messages" not in body
    assert body.get("n", 1) == 1
    for key in ("best_of", "min_tokens", "max_completion_tokens", "prompt_logprobs"):
        assert key not in body
    # the caller's keys are sampling parameters (the correctness suite adds its own token ids,
    # and asks vLLM to name its top-k by id)
    own = {"return_token_ids", "return_tokens_as_token_ids"}
    assert set(body) - GATE_SET_KEYS <= {*catalogue.EXTRA_ALLOWED, *own}


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sc=scenario())
def test_an_accepted_suite_scenario_builds_only_capped_bodies(sc: dict[str, Any]) -> None:
    try:
        spec = parse_spec(BASE | {"scenarios": [sc]})
    except SpecError:
        event("refused by the spec")
        return
    if spec_limit_problems(spec, LIMITS):
        event("refused by the caps")
        return
    event("accepted")
    (accepted,) = spec.scenarios
    assert accepted.suite is not None
    entry = catalogue.get(accepted.suite, **accepted.settings)
    if isinstance(entry, catalogue.Correctness):  # sent by run_correctness, not request_body
        reqs = entry.requests(0)
        assert all(r.max_tokens <= LIMITS.max_output_tokens for r in reqs)
    else:
        reqs = entry.build(seed=0).requests
    for api in ("completions", "chat"):
        target = Target("t", "http://127.0.0.1:1", api=api, model="the-model")
        for req in reqs:
            _check_body(request_body(target, req), req, target)


def test_the_property_sees_accepted_scenarios() -> None:
    """The strategy is not all refusals: honest scenarios of each suite pass and are checked."""
    honest: list[dict[str, Any]] = [
        {"suite": "normal", "rate": 20, "requests": 30, "extra": {"temperature": 0.3, "n": 1}},
        {"suite": "peak", "rate": 40, "duration_s": 2, "max_tokens": 512, "slo_ttft_ms": 200},
        {"suite": "overload", "rate": 5, "overload_rate": 30, "before_s": 1, "overload_s": 1,
         "after_s": 1, "extra": {"stop": ["\n"], "seed": 3}},
        {"suite": "compatibility"},
    ]  # fmt: skip
    with pytest.raises(SpecError, match=r"extra\.n: .*not allowed"):
        parse_spec(BASE | {"scenarios": honest[:1]})  # n is refused even as 1: the gate's to set
    honest[0]["extra"] = {"temperature": 0.3}
    for sc in honest:
        spec = parse_spec(BASE | {"scenarios": [sc]})
        assert spec_limit_problems(spec, LIMITS) == []
        entry = catalogue.get(spec.scenarios[0].suite or "", **spec.scenarios[0].settings)
        target = Target("t", "http://127.0.0.1:1", model="the-model")
        built = entry.build(seed=1).requests
        assert built
        for req in built:
            _check_body(request_body(target, req), req, target)
