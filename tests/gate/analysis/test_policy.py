"""Policy validation: bad specs fail loudly, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gate.analysis.policy import Policy, quantile_key


def _error_fields(kwargs: dict[str, Any]) -> set[str]:
    with pytest.raises(ValidationError) as info:
        Policy.model_validate(kwargs)
    return {str(err["loc"][0]) for err in info.value.errors()}


def test_defaults() -> None:
    p = Policy()
    assert p.group_alpha("latency") == pytest.approx(0.015)
    # The tail checks (0.1 of alpha) were carved out of the latency budget (0.4 before).
    assert p.group_alpha("tail") == pytest.approx(0.005)
    # Judge v3 (issue 28): the tail check counts exceedances over the pooled slow tail with the
    # candidate deflated by 1 + tolerance, and its tolerance is the p90's (tails.py).
    assert p.tail.tolerance == pytest.approx(0.10)
    # p99 is the tail check's job (issue 17): one noisy quantile cannot be pinned at the sizes
    # people run, the slowest 5% as a whole can.
    assert p.checked_quantiles == (0.5, 0.9)
    assert p.require == [] and p.detect == {} and p.noise == pytest.approx(0.3)
    # 0.10, not 0.15: a 15% tail regression must be holdable, so its true ratio may not sit
    # on the threshold (issue 5).
    assert p.tolerance_for(0.99) == 0.10
    assert p.metrics == ["ttft", "itl"]
    assert sum(p.alpha_split.values()) == pytest.approx(1.0)
    assert Policy.model_validate_json(p.model_dump_json()) == p


def test_judge_v3_defaults() -> None:
    """The fields judge v3 added (issue 28), at the values their descriptions argue for: the
    pass side of every latency check spends beta 5%; a window of blocks may be 50% slower and
    a creep may end 10% up before they fail; a scenario too short to decide is refused; the
    candidate may fail 1 point more of its requests than the reference for an early stop;
    errors less than 2 s apart chain into one episode."""
    p = Policy()
    assert p.beta == pytest.approx(0.05)
    assert p.window_tolerance == pytest.approx(0.5)
    assert p.creep_tolerance == pytest.approx(0.10)
    assert p.short_scenarios == "refuse"
    assert p.error_tolerance == pytest.approx(0.01)
    assert p.error_burst_s == pytest.approx(2.0)
    allowed = Policy(short_scenarios="allow", beta=0.1, window_tolerance=1.0, error_tolerance=0.0)
    assert Policy.model_validate_json(allowed.model_dump_json()) == allowed


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha_split": {"latency": 0.5, "errors": 0.2, "correctness": 0.4}}, "alpha_split"),
        ({"alpha_split": {"latency": 0.4, "errors": 0.2, "bogus": 0.4}}, "alpha_split"),
        ({"alpha_split": {"latency": 0.6, "errors": 0.4}}, "alpha_split"),
        ({"alpha_split": {"latency": 0.0, "errors": 0.6, "correctness": 0.4}}, "alpha_split"),
        ({"alpha_split": {"latency": 1.2, "errors": -0.2, "correctness": 0.0}}, "alpha_split"),
        ({"thresholds": {}}, "thresholds"),
        ({"alpha": 0.5}, "alpha"),
        ({"alpha": 0.0}, "alpha"),
        ({"quantiles": [0.5, 1.0]}, "quantiles"),
        ({"quantiles": []}, "quantiles"),
        ({"quantiles": "all"}, "quantiles"),
        ({"quantiles": [0.5, 0.95]}, "tolerance"),
        ({"tolerance": {"p50": 0.05}}, "tolerance"),
        ({"require": ["ttft.p5O"]}, "require"),
        ({"require": ["gpu.p50"]}, "require"),
        ({"require": ["p50", "p50"]}, "require"),
        ({"detect": {"tail": 0.0}}, "detect"),
        ({"detect": {"ttft.mean": 0.1}}, "detect"),
        ({"noise": 0.0}, "noise"),
        ({"tolerance": {"median": 0.05}}, "tolerance"),
        ({"tolerance": {"p50": -0.1, "p90": 0.1, "p99": 0.1}}, "tolerance"),
        ({"metrics": ["ttft", "tpot"]}, "metrics"),
        (
            {"alpha_split": {"latency": 0.4, "errors": 0.2, "correctness": 0.3, "peak": 0.1}},
            "alpha_split",
        ),
        ({"error_kinds": ["timeout", "timeout"]}, "error_kinds"),
        ({"error_kinds": ["other"]}, "error_kinds"),
        ({"look_every": 0}, "look_every"),
        ({"load": {"goodput_tolerance": 1.5}}, "load"),
        ({"divergence": {"top_k": 0}}, "divergence"),
        ({"divergence": {"bogus": 1}}, "divergence"),
        ({"tail": {"start": 0.99, "top": 0.95}}, "tail"),
        ({"tail": {"tolerance": -0.1}}, "tail"),
        ({"tail": {"start": 1.0}}, "tail"),
        ({"metrics": []}, "metrics"),
        ({"metrics": ["ttft", "ttft"]}, "metrics"),
        ({"max_error_rate": 1.5}, "max_error_rate"),
        ({"startup_slack_s": -1.0}, "startup_slack_s"),
        ({"warmup_requests": -1}, "warmup_requests"),
        ({"beta": 0.0}, "beta"),
        ({"beta": 0.5}, "beta"),
        ({"window_tolerance": 0.0}, "window_tolerance"),
        ({"window_tolerance": 11.0}, "window_tolerance"),
        ({"creep_tolerance": 0.0}, "creep_tolerance"),
        ({"short_scenarios": "skip"}, "short_scenarios"),
        ({"error_tolerance": -0.01}, "error_tolerance"),
        ({"error_tolerance": 1.0}, "error_tolerance"),
        ({"error_burst_s": -1.0}, "error_burst_s"),
    ],
)
def test_invalid_policies_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    assert field in _error_fields(kwargs)


def test_listed_quantiles_and_keys() -> None:
    p = Policy(quantiles=[0.999, 0.5], tolerance={"p50": 0.05, "p99.9": 0.2})
    assert p.quantiles == [0.5, 0.999]
    assert p.tolerance_for(0.999) == 0.2
    assert [quantile_key(q) for q in (0.5, 0.9, 0.99, 0.999)] == ["p50", "p90", "p99", "p99.9"]


def test_older_three_group_split_still_validates() -> None:
    """Specs written before load and startup existed keep working: those groups weigh 0."""
    p = Policy(alpha_split={"latency": 0.4, "errors": 0.2, "correctness": 0.4})
    assert p.group_alpha("load") == 0.0
    assert p.group_alpha("startup") == 0.0
    assert p.group_alpha("tail") == 0.0
    assert p.group_alpha("correctness") == pytest.approx(0.02)


def test_e2e_is_a_metric() -> None:
    assert Policy(metrics=["ttft", "itl", "e2e"]).metrics == ["ttft", "itl", "e2e"]


def test_policy_caps_bootstrap_resamples() -> None:
    """Two million resamples took 26 s and 2 GB for one gate: refused, naming the field, in a
    spec as in a bare policy (the rejudge endpoint validates the same model)."""
    from gate.core.errors import SpecError
    from gate.spec import parse_spec

    assert "bootstrap_resamples" in _error_fields({"bootstrap_resamples": 2_000_000})
    assert Policy(bootstrap_resamples=20_000).bootstrap_resamples == 20_000
    spec = {
        "name": "t",
        "model": "m",
        "reference": {"url": "http://127.0.0.1:1"},
        "candidate": {"url": "http://127.0.0.1:2"},
        "scenarios": [{"name": "s", "rate": 1, "requests": 10}],
        "policy": {"bootstrap_resamples": 2_000_000},
    }
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    paths = {p.path: p.message for p in info.value.problems}
    assert "less than or equal to 20000" in paths["policy.bootstrap_resamples"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"look_every": 1}, "look_every"),
        ({"look_every": 10_000_000}, "look_every"),
        ({"bootstrap_block_s": 1e-9}, "bootstrap_block_s"),
        ({"quantiles": [i / 20 for i in range(1, 10)]}, "quantiles"),
        ({"tolerance": {f"p{i}": 0.1 for i in range(1, 40)}}, "tolerance"),
        ({"error_kinds": [f"k{i}" for i in range(33)]}, "error_kinds"),
        ({"error_kinds": ["x" * 65]}, "error_kinds"),
        ({"extend": 5.0}, "extend"),
        ({"warmup_requests": 10**9}, "warmup_requests"),
        ({"load": {"recovery_window_s": 1e-6}}, "load"),
    ],
)
def test_every_size_that_drives_work_is_capped(kwargs: dict[str, Any], field: str) -> None:
    assert field in _error_fields(kwargs)


def test_caps_leave_room_for_real_policies() -> None:
    p = Policy(
        look_every=10,
        quantiles=[0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999],
        tolerance={
            "p50": 0.05,
            "p75": 0.05,
            "p90": 0.1,
            "p95": 0.1,
            "p99": 0.1,
            "p99.5": 0.1,
            "p99.9": 0.2,
            "p99.99": 0.3,
        },
        error_kinds=[f"k{i}" for i in range(32)],
    )
    assert len(p.checked_quantiles) == 8


def test_require_and_detect_keys_match_metric_and_check() -> None:
    p = Policy(require=["ttft.p90", "tail"], detect={"ttft.p50": 0.05, "tail": 0.15})
    assert p.requires("ttft", 0.9) and not p.requires("itl", 0.9)
    assert p.requires("ttft", None) and p.requires("itl", None)
    assert not p.requires("ttft", 0.5)
    assert p.detect_for("ttft", 0.5) == 0.05 and p.detect_for("itl", 0.5) is None
    assert p.detect_for("itl", None) == 0.15


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"require": ["ttft.p99"]}, "names p99, which the quantiles setting does not check"),
        ({"require": ["e2e.p50"]}, "names metric 'e2e', which metrics"),
        ({"detect": {"p99": 0.1}}, "names p99"),
        (
            {
                "require": ["tail"],
                "alpha_split": {"latency": 0.4, "errors": 0.3, "correctness": 0.3},
            },
            "turns off",
        ),
    ],
)
def test_require_and_detect_must_name_a_planned_check(kwargs: dict, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError) as info:
        Policy(**kwargs)
    assert words in str(info.value)
    assert Policy(require=["ttft.p99"], quantiles=[0.5, 0.99]).requires("ttft", 0.99)


def test_window_and_creep_are_check_keys() -> None:
    """Judge v3 plans a window and a creep check per scenario and metric: `require` and
    `detect` may name them like a quantile or the tail, per metric or for every metric, and
    the key of one check does not match another."""
    p = Policy(require=["ttft.window", "creep"])
    assert p.requires("ttft", None, "window") and not p.requires("itl", None, "window")
    assert p.requires("ttft", None, "creep") and p.requires("itl", None, "creep")
    assert not p.requires("ttft", None, "tail") and not p.requires("ttft", 0.5)
    assert _error_fields({"require": ["ttft.stall"]}) == {"require"}
