"""The engine checks (gate/analysis/engine_metrics.py): the preemption tests keep their error
rate when preemptions come in bursts, and find a regression that preempts in bursts or all the
time; the rules compare what each engine's metrics state; what is missing is a note."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from gate.analysis.engine_metrics import (
    EngineSeries,
    ScenarioTelemetry,
    block_sign_test,
    engine_metric_checks,
    preemption_test,
)
from gate.analysis.policy import Policy

INTERVAL_S = 0.25


def bursty(
    rng: np.random.Generator, duration_s: float, rate_per_s: float, scale: float = 1.0
) -> np.ndarray:
    """A preemption counter scraped every INTERVAL_S: bursts at Poisson times (rate_per_s), each
    lasting 0.2-1.5 s with 5 to 60 preemptions, as a KV cache that runs out at a passing peak."""
    t = np.arange(0.0, duration_s, INTERVAL_S)
    rises = np.zeros_like(t)
    start = rng.exponential(1.0 / rate_per_s)
    while start < duration_s:
        length = rng.uniform(0.2, 1.5)
        n = int(rng.integers(5, 61) * scale)
        at = rng.uniform(start, start + length, n)
        rises += np.histogram(at, bins=np.append(t, t[-1] + INTERVAL_S))[0]
        start += length + rng.exponential(1.0 / rate_per_s)
    return np.cumsum(rises)


def series(counter: np.ndarray, **config: str) -> EngineSeries:
    t = np.arange(counter.size) * INTERVAL_S
    return EngineSeries(t, {"preemptions_total": counter.astype(float)}, config)


def one(ref: EngineSeries | None, cand: EngineSeries | None, policy: Policy | None = None):
    notes: list[str] = []
    checks = engine_metric_checks([ScenarioTelemetry("peak", ref, cand)], policy or Policy(), notes)
    return {c.id: c for c in checks}, notes


def test_bursty_identical_engines_are_held_at_most_alpha_and_naive_counts_are_not() -> None:
    """A/A with bursts (each engine's own, independent): at alpha 0.1 the check holds at most
    about 10% of 400 gates, while a binomial test on raw preemption counts holds most of them."""
    rng = np.random.default_rng(7)
    policy = Policy(
        alpha_split={"latency": 0.5, "errors": 0.2, "correctness": 0.2, "engine": 0.1}, alpha=0.49
    )
    alpha = policy.group_alpha("engine")  # ~0.049 over one scenario
    held = naive = 0
    runs = 400
    for _ in range(runs):
        r, c = bursty(rng, 60.0, 0.1), bursty(rng, 60.0, 0.1)
        checks, _ = one(series(r), series(c), policy)
        held += checks["peak.engine.preemptions"].decision == "fail"
        n_r, n_c = int(r[-1]), int(c[-1])
        if n_r + n_c and stats.binom.sf(n_c - 1, n_r + n_c, 0.5) <= alpha:
            naive += 1
    bound = alpha + 3 * np.sqrt(alpha * (1 - alpha) / runs)
    assert held / runs <= bound, (held, runs, alpha)
    assert naive / runs > 0.3, naive  # what counting coins would do


@pytest.mark.parametrize("shape", ["sustained", "bursts x13"])
def test_a_candidate_that_preempts_more_is_held(shape: str) -> None:
    """Power at the default alpha (0.0025 for one scenario): a 30 s peak through which the
    candidate preempts all the time, or a minute in which it has 13 times the reference's
    bursts (0.4/s against 0.03/s), each found in at least 45 of 50 gates."""
    rng = np.random.default_rng(11)
    policy = Policy(engine={"preemption_block_s": 1.0})
    found = 0
    for _ in range(50):
        if shape == "sustained":  # runs out at the peak's start and keeps preempting
            r = bursty(rng, 30.0, 0.03)
            c = np.cumsum(rng.poisson(3.0, r.size)).astype(float)
        else:
            r, c = bursty(rng, 60.0, 0.03), bursty(rng, 60.0, 0.4)
        checks, _ = one(series(r), series(c), policy)
        found += checks["peak.engine.preemptions"].decision == "fail"
    assert found >= 45, found


def test_no_preemptions_on_either_engine_passes_and_a_missing_counter_is_a_note() -> None:
    zero = np.zeros(40)
    checks, notes = one(series(zero), series(zero))
    assert checks["peak.engine.preemptions"].decision == "pass"
    llama = EngineSeries(np.arange(40) * 0.25, {"requests_waiting": np.zeros(40)}, {})
    checks, notes = one(series(zero), llama)
    assert "peak.engine.preemptions" not in checks
    assert any("preemptions not compared" in n for n in notes)
    assert any("KV cache capacity not compared" in n for n in notes)
    assert all(c.decision != "fail" for c in checks.values())


def test_preemption_test_and_sign_test_edges() -> None:
    assert preemption_test(0, 0, 0.0) == (1.0, 0.5)
    p, p0 = preemption_test(0, 7, 0.0)
    assert p == pytest.approx(0.5**7) and p0 == 0.5
    p_tol, p0_tol = preemption_test(0, 7, 1.0)
    assert p0_tol == pytest.approx(2 / 3) and p_tol > p
    ramp = series(np.arange(40.0))
    p, more, fewer = block_sign_test(series(np.zeros(40)), ramp, 1.0, 0.0)
    assert (more, fewer) == (10, 0) and p == pytest.approx(0.5**10)


def test_a_restart_that_resets_the_counter_is_no_preemption_episode() -> None:
    """An engine restart resets its counters to 0: the drop is not a rise, while preemptions
    counted again after it are."""
    ref = np.zeros(60)
    ref[10:], ref[20:], ref[40:] = 4.0, 8.0, 12.0
    cand = ref.copy()
    cand[30:], cand[40:] = 0.0, 4.0  # restarted at 30 s, one episode at 40 s after it
    r, c = series(ref), series(cand)
    assert list(c.rises("preemptions_total")) == [2.5, 5.0, 10.0]  # type: ignore[arg-type]
    assert c.increase("preemptions_total") == r.increase("preemptions_total") == 12.0
    checks, _ = one(r, c)
    assert checks["peak.engine.preemptions"].decision == "pass"
    assert "in 3 episodes, reference 12 in 3" in checks["peak.engine.preemptions"].message
    again = cand.copy()
    again[30:] = 3.0  # restarted and preempted 3 before the next scrape
    assert 7.5 in list(series(again).rises("preemptions_total"))  # type: ignore[arg-type]


def kv(tokens: str | None, blocks: str, **extra: str) -> EngineSeries:
    cfg = {"kv_cache_blocks": blocks, "block_size": "16", "cache_dtype": "auto", **extra}
    if tokens is not None:
        cfg["kv_cache_tokens"] = tokens
    return series(np.zeros(20), **cfg)


def test_kv_capacity_rule_at_its_tolerance() -> None:
    checks, _ = one(kv("1000", "62"), kv("950", "59"))
    assert checks["engine.kv_capacity"].decision == "pass"  # 0.95: the limit itself
    checks, _ = one(kv("1000", "62"), kv("949", "59"))
    c = checks["engine.kv_capacity"]
    assert c.decision == "fail" and c.holds and "KV cache is smaller" in c.message
    assert "kv_cache_blocks 59" in c.message
    # blocks where one engine states no tokens
    checks, _ = one(kv(None, "100"), kv("800", "50"))
    assert checks["engine.kv_capacity"].ratio == pytest.approx(0.5)


def rates(
    queries: float, hits: float, waiting: float = 0.0, draft: float = 0.0, acc: float = 0.0
) -> EngineSeries:
    t = np.arange(10) * 1.0
    ramp = np.linspace(0, 1, 10)
    s = {
        "prefix_cache_queries_total": queries * ramp,
        "prefix_cache_hits_total": hits * ramp,
        "requests_waiting": np.full(10, waiting),
        "preemptions_total": np.zeros(10),
    }
    if draft:
        s["spec_decode_draft_tokens_total"] = draft * ramp
        s["spec_decode_accepted_tokens_total"] = acc * ramp
    return EngineSeries(t, s, {})


def test_prefix_cache_spec_decode_and_queue_rules() -> None:
    checks, _ = one(rates(1000, 600), rates(1000, 550))
    assert checks["peak.engine.prefix_cache_hit_rate"].decision == "pass"
    checks, _ = one(rates(1000, 600), rates(1000, 400))
    assert checks["peak.engine.prefix_cache_hit_rate"].decision == "fail"
    checks, notes = one(rates(1000, 10), rates(1000, 0))
    assert "peak.engine.prefix_cache_hit_rate" not in checks
    assert any("share no prefix" in n for n in notes)
    # prefix caching off (vLLM's --no-enable-prefix-caching): the counters are exported but
    # never move, as vLLM records no lookup then (kv_cache_manager.py get_computed_blocks)
    checks, _ = one(rates(1000, 600), rates(0, 0))
    off = checks["peak.engine.prefix_cache_hit_rate"]
    assert off.decision == "fail" and off.candidate == 0.0 and off.reference == 0.6
    checks, notes = one(rates(0, 0), rates(0, 0))  # neither looked anything up: no check
    assert "peak.engine.prefix_cache_hit_rate" not in checks
    checks, _ = one(rates(1, 0, draft=100, acc=70), rates(1, 0, draft=100, acc=50))
    assert checks["peak.engine.spec_decode_acceptance"].decision == "fail"
    checks, _ = one(rates(1, 0, waiting=2.0), rates(1, 0, waiting=8.0))
    assert checks["peak.engine.queue_depth"].decision == "pass"  # 2 x 2 + 4 = 8
    checks, _ = one(rates(1, 0, waiting=2.0), rates(1, 0, waiting=8.5))
    assert checks["peak.engine.queue_depth"].decision == "fail"
    # A reference that queues too (over queue_slack): near saturation two engines' queues are
    # random walks of their own under the same arrivals, so a rule would hold A/A gates (review:
    # 8% at load 1.0 in a toy model). Not shown, never a hold; a clear excess below it still is.
    checks, _ = one(rates(1, 0, waiting=10.0), rates(1, 0, waiting=40.0))
    q = checks["peak.engine.queue_depth"]
    assert q.decision == "undecided" and "the reference queues too" in q.message
    checks, _ = one(rates(1, 0, waiting=4.0), rates(1, 0, waiting=12.5))
    assert checks["peak.engine.queue_depth"].decision == "fail"  # 2 x 4 + 4 = 12


def test_a_share_is_counted_from_counters_else_read_from_the_gauge() -> None:
    """EngineSeries.share, behind the prefix-cache hit rate and the draft acceptance: two
    counters where the whole rose (a restart counted from zero), else the engine's own gauge
    (SGLang states its prefix cache as `cache_hit_rate` only: gate/telemetry/vocabulary.py)."""
    t = np.arange(4) * 1.0
    restarted = EngineSeries(
        t,
        {"q": np.array([0.0, 100.0, 20.0, 60.0]), "h": np.array([0.0, 50.0, 5.0, 25.0])},
    )
    assert restarted.share("h", "q", "rate") == pytest.approx((50 + 5 + 20) / (100 + 20 + 40))
    gauge = EngineSeries(t, {"q": np.zeros(4), "h": np.zeros(4), "rate": np.full(4, 0.3)})
    assert gauge.share("h", "q", "rate") == pytest.approx(0.3)  # nothing looked up: the gauge
    assert EngineSeries(t, {"q": np.zeros(4)}).share("h", "q", "rate") is None


def test_no_timeline_from_an_engine_is_a_note_never_a_hold() -> None:
    checks, notes = one(series(np.zeros(5)), None)
    assert checks == {}
    assert notes == ["peak: no engine metrics from the candidate."]


def test_engine_policy_bounds_name_the_field() -> None:
    with pytest.raises(ValueError, match="kv_capacity_tolerance"):
        Policy(engine={"kv_capacity_tolerance": 1.5})
    with pytest.raises(ValueError, match="preemption_block_s"):
        Policy(engine={"preemption_block_s": 0})
