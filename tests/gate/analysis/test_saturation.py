"""Saturation (gate/analysis/saturation.py): a queue that grows through a scenario is named, on
the candidate as a failed check and on the reference as a `gate.environment` hold, while a
warm-up, a steadily slow engine, a stable queue near capacity and heavy tails are not.

The engines are FIFO queues simulated with numpy: `slots` servers, Poisson arrivals mirrored to
both engines, each request occupying a slot for its service time (prefill then decode), whose
service times share a lognormal factor per batch of 8 consecutive requests; a request waits
max(0, earliest slot free - arrival), its TTFT is that wait plus its prefill and its e2e that
wait plus its whole service.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from scipy.stats import binom

from gate.analysis.errors import ENVIRONMENT
from gate.analysis.saturation import (
    MAX_SERVED_SHARE,
    MIN_REQUESTS,
    queue_growth,
    saturation_checks,
)
from gate.analysis.types import ArmSamples, ScenarioSamples

N = 400  # requests per arm: 100 s at 4/s
RATE = 4.0


def arrivals(seed: int, n: int = N, rate: float = RATE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.exponential(1.0 / rate, n))
    return np.asarray(a - a[0], dtype=np.float64)


def queue(
    seed: int,
    sent: np.ndarray,
    service_s: float,
    *,
    slots: int = 1,
    prefill_share: float = 1.0,
    batch_sd: float = 0.3,
    request_sd: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT ms, e2e ms) of a FIFO queue with `slots` servers; the mean service is service_s."""
    rng = np.random.default_rng(seed)
    n = sent.size
    batch = np.repeat(rng.normal(0.0, batch_sd, (n + 7) // 8), 8)[:n]
    service = service_s * np.exp(
        batch + rng.normal(0.0, request_sd, n) - (batch_sd**2 + request_sd**2) / 2.0
    )
    free = [0.0] * slots
    start = np.empty(n)
    for i in range(n):
        earliest = heapq.heappop(free)
        start[i] = max(sent[i], earliest)  # waits max(0, earliest free - arrival)
        heapq.heappush(free, float(start[i] + service[i]))
    wait = start - sent
    ttft = wait + prefill_share * service
    e2e = wait + service
    return ttft * 1000.0, e2e * 1000.0


def arm(sent: np.ndarray, ttft_ms: np.ndarray, e2e_ms: np.ndarray | None = None) -> ArmSamples:
    e2e = ttft_ms + 500.0 if e2e_ms is None else e2e_ms
    ids = np.arange(sent.size)
    return ArmSamples(
        requests=sent.size,
        ttft_ms=ttft_ms,
        itl_ms=np.full(sent.size, 20.0),
        e2e_ms=e2e,
        offsets_s={"ttft": sent, "itl": sent, "e2e": sent},
        ids={"ttft": ids, "itl": ids, "e2e": ids},
    )


def engine(seed: int, sent: np.ndarray, utilisation: float) -> ArmSamples:
    """A single-slot engine loaded to `utilisation` (offered rate x mean service)."""
    rate = (sent.size - 1) / float(sent[-1] - sent[0])
    return arm(sent, *queue(seed, sent, utilisation / rate))


def scenario(reference: ArmSamples, candidate: ArmSamples) -> ScenarioSamples:
    return ScenarioSamples("steady", reference, candidate)


# -- a growing queue is named ---------------------------------------------------------------


def test_a_candidate_whose_queue_grows_fails() -> None:
    sent = arrivals(1)
    s = scenario(engine(2, sent, 0.5), engine(3, sent, 1.3))
    notes: list[str] = []
    checks = saturation_checks(s, notes, offered_rate=RATE)
    assert len(checks) == 1, notes
    c = checks[0]
    assert c.id == "steady.saturation.candidate" and c.group == "overload"
    assert c.decision == "fail" and c.holds and c.scenario == "steady"
    assert c.interval is None and c.estimate_interval is None
    assert c.samples == (N, N) and c.threshold == MAX_SERVED_SHARE
    assert "candidate's queue grows through steady" in c.message
    assert "cannot serve the offered 4/s; the reference serves it" in c.message
    # sane numbers: throughput near 1/1.3 of the offered rate, the reference keeping up
    assert c.candidate is not None and c.reference is not None
    assert c.candidate == pytest.approx(1 / 1.3, abs=0.08)
    assert c.reference == pytest.approx(1.0, abs=0.05)
    g = queue_growth(s.candidate, "candidate", offered_rate=RATE)
    assert g is not None and g.saturated
    q = g.quarter_medians_ms
    assert q[0] < q[1] < q[2] < q[3]
    assert g.growth == pytest.approx(q[3] / q[0]) and g.growth > 3.0
    # the wait gains about lambda/mu - 1 = 0.3 s per second
    assert g.slope == pytest.approx(0.3, abs=0.1)
    assert f"{g.growth:.3g}x" in c.message
    assert f"requests/s of the {g.offered_rate:.3g}/s sent" in c.message
    assert g.offered_rate == pytest.approx(RATE, rel=0.05)


def test_both_queues_growing_is_the_environment() -> None:
    sent = arrivals(4)
    s = scenario(engine(5, sent, 1.4), engine(6, sent, 1.6))
    checks = saturation_checks(s, [], offered_rate=RATE)
    assert len(checks) == 1
    c = checks[0]
    assert c.id == ENVIRONMENT and c.group == "errors" and c.metric == "environment"
    assert c.decision == "undecided" and c.required and c.holds
    assert "beyond what the test bed can serve" in c.message
    assert "lower the scenario's rate to about" in c.message
    assert "The candidate's queue grows too" in c.message
    assert c.reference is not None and c.reference == pytest.approx(1 / 1.4, abs=0.08)


def test_a_reference_behind_the_load_without_a_growing_queue_is_still_the_environment() -> None:
    """Real vLLM on a starved host: both engines completed 38-43% of 7.9/s; the candidate's TTFT
    rose through the scenario, the reference's rose and then plateaued (no trend to the end),
    and judge v3 held the candidate alone, saying "the reference serves it". Falling behind the
    rate sent (completions at most MAX_SERVED_SHARE of it) is the test bed's overload."""
    sent = arrivals(21)
    cand = engine(22, sent, 1.6)
    # the reference: behind the rate sent (completions spread over 2.5x the send span), its
    # first requests served at once and the rest waiting 15-35 s, up and down with no trend
    # to the end (as the real one's 3 s, 18 s, 30 s, 22 s, 18 s, 34 s, 30 s, 17 s): its queue
    # is not called growing
    e2e = 60_000.0 + sent * 1500.0  # completes at 1/2.5 of the rate sent
    ttft = 25_000.0 + 10_000.0 * np.sin(sent / 10.0)
    ttft[np.argsort(sent)[:8]] = 100.0
    ref = arm(sent, ttft, e2e)
    g = queue_growth(ref, "reference", offered_rate=RATE)
    assert g is not None and not g.saturated and g.served_share is not None
    assert g.served_share <= MAX_SERVED_SHARE
    checks = saturation_checks(scenario(ref, cand), [], offered_rate=RATE)
    assert [c.id for c in checks] == [ENVIRONMENT]
    assert checks[0].decision == "undecided" and checks[0].required
    assert "The reference fell behind in steady too" in checks[0].message
    assert "The candidate's queue grows too" in checks[0].message


def test_a_healthy_reference_with_varied_answers_does_not_excuse_a_saturated_candidate() -> None:
    """A reference whose answers vary from 0.5 s to 20 s completes over a wider span than it
    was sent over, and in a short scenario reads a share of completions near 0.8; its TTFT is
    flat and fast. That is no test-bed overload: the candidate's growing queue is its own
    (found in review: rule (a) alone sent it to gate.environment)."""
    sent = arrivals(41, n=300, rate=10.0)
    rng = np.random.default_rng(42)
    ttft = rng.lognormal(math.log(60.0), 0.2, sent.size)
    e2e = ttft + rng.uniform(500.0, 20_000.0, sent.size)
    ref = arm(sent, ttft, e2e)
    g = queue_growth(ref, "reference", offered_rate=10.0)
    assert g is not None and g.served_share is not None and g.served_share <= MAX_SERVED_SHARE
    cand = engine(43, sent, 1.6)
    checks = saturation_checks(scenario(ref, cand), [], offered_rate=10.0)
    assert [c.id for c in checks] == ["steady.saturation.candidate"]
    assert checks[0].decision == "fail"


def test_a_reference_whose_queue_grows_is_the_environment_alone() -> None:
    sent = arrivals(7)
    s = scenario(engine(8, sent, 1.3), engine(9, sent, 0.5))
    checks = saturation_checks(s, [], offered_rate=RATE)
    assert [c.id for c in checks] == [ENVIRONMENT]
    assert "grows too" not in checks[0].message
    assert "The candidate's did not" in checks[0].message


def test_the_motivating_case_max_num_seqs_1_against_8() -> None:
    """A candidate with one slot against a reference with eight: at 4/s both queues grow (the
    gate must not compare them), at 2.4/s only the candidate's does (it holds)."""

    def pair(rate: float, seed: int) -> ScenarioSamples:
        sent = arrivals(seed, rate=rate)
        ref = arm(sent, *queue(seed + 1, sent, 2.5, slots=8, prefill_share=0.02))
        cand = arm(sent, *queue(seed + 2, sent, 0.5, slots=1, prefill_share=0.1))
        return ScenarioSamples("steady", ref, cand)

    at4 = saturation_checks(pair(4.0, 10), [], offered_rate=4.0)
    assert [c.id for c in at4] == [ENVIRONMENT]
    at24 = saturation_checks(pair(2.4, 20), [], offered_rate=2.4)
    assert [c.id for c in at24] == ["steady.saturation.candidate"]
    assert at24[0].candidate == pytest.approx(2.0 / 2.4, abs=0.08)


# -- what is not a growing queue ------------------------------------------------------------


def test_a_warm_up_transient_is_not_saturation() -> None:
    sent = arrivals(11)
    ref = engine(12, sent, 0.5)
    ttft, e2e = queue(13, sent, 0.5 / RATE)
    slow = np.arange(N) < N // 10  # the first 10% five times slower (compilation)
    cand = arm(sent, np.where(slow, ttft * 5.0, ttft), np.where(slow, e2e * 5.0, e2e))
    notes: list[str] = []
    assert saturation_checks(scenario(ref, cand), notes, offered_rate=RATE) == []
    assert notes == []


def test_a_steadily_slower_candidate_is_left_to_the_latency_checks() -> None:
    sent = arrivals(14)
    s = scenario(engine(15, sent, 0.2), engine(16, sent, 0.6))  # service 3x slower, stable
    assert saturation_checks(s, [], offered_rate=RATE) == []
    rng = np.random.default_rng(17)
    base = rng.lognormal(math.log(150.0), 0.3, N)
    s = scenario(arm(sent, base), arm(sent, 3.0 * base * rng.lognormal(0.0, 0.1, N)))
    assert saturation_checks(s, [], offered_rate=RATE) == []


def test_stable_queues_at_90_percent_are_not_called() -> None:
    """Both engines single-slot at 90% utilisation, batch-correlated service times: their
    queues wander (an M/D/1 queue at 0.9 relaxes over hundreds of requests) but stay stable.
    The module's simulations give 0 calls in 600 such arms (docstring); this asserts at most 1
    scenario of 200 (2 arms each). A queueing warning may come (it holds nothing): about 7% of
    such scenarios, whose reference's median TTFT is 10x its first requests'."""
    called = 0
    for seed in range(200):
        sent = arrivals(1000 + seed)
        s = scenario(engine(2000 + seed, sent, 0.9), engine(3000 + seed, sent, 0.9))
        called += any(c.holds for c in saturation_checks(s, [], offered_rate=RATE))
    assert called <= 1


def test_a_reference_that_queues_without_a_growing_queue_is_a_warning_not_a_hold() -> None:
    """Real vLLM on an overloaded host: the reference's TTFT wandered between 3 s and 34 s
    (its first requests 0.1 s) with no trend to the end, and an A/A gate continued on a
    candidate "3.4x faster" without a word. Now a `gate.environment` warning says the
    latency checks compared two queues; it holds nothing. At half load: nothing."""
    sent = arrivals(31)
    rng = np.random.default_rng(32)
    wander = 3000.0 + 30000.0 * np.abs(np.sin(sent / 15.0))  # up and down, no trend
    wander[np.argsort(sent)[:8]] = 100.0  # the first requests find an empty queue
    ref = arm(sent, wander * rng.lognormal(0.0, 0.1, sent.size))
    cand = arm(sent, 0.4 * wander * rng.lognormal(0.0, 0.1, sent.size))
    checks = saturation_checks(scenario(ref, cand), [], offered_rate=RATE)
    assert [c.id for c in checks] == [ENVIRONMENT]
    (c,) = checks
    assert c.warning and not c.holds and not c.required
    assert "The reference queued through steady" in c.message and "two queues" in c.message
    calm = [scenario(engine(40 + k, sent, 0.5), engine(60 + k, sent, 0.5)) for k in range(20)]
    assert not any(saturation_checks(x, [], offered_rate=RATE) for x in calm)


def test_heavy_tailed_latencies_without_growth_are_not_called() -> None:
    called = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        sent = arrivals(500 + seed)
        ref = arm(sent, rng.lognormal(math.log(200.0), 1.0, N))
        cand = arm(sent, rng.lognormal(math.log(200.0), 1.0, N))
        called += bool(saturation_checks(scenario(ref, cand), [], offered_rate=RATE))
    assert called == 0


def test_the_trend_test_holds_its_level_on_blocks_of_dependent_requests() -> None:
    """What the code guarantees: with no trend and blocks far longer than the dependence
    (batches of 8 sharing a lognormal factor, heavy per-request tails), the block test rejects
    at most alpha of the time, and every call needs that rejection. At alpha 0.05, 400 arms:
    the rejections stay under the 99.9% quantile of Binomial(400, 0.05)."""
    alpha = 0.05
    rejected = 0
    sent = arrivals(77)
    for seed in range(400):
        rng = np.random.default_rng(seed)
        shared = np.repeat(rng.normal(0.0, 0.5, N // 8), 8)
        ttft = 200.0 * np.exp(shared + rng.normal(0.0, 1.0, N))
        g = queue_growth(arm(sent, ttft), "candidate", offered_rate=RATE, alpha=alpha)
        assert g is not None and not g.saturated
        rejected += g.trend
    assert rejected <= binom.ppf(0.999, 400, alpha)


# -- time, completions and small samples -----------------------------------------------------


def test_without_offsets_time_is_approximated_from_ids_and_said() -> None:
    sent = arrivals(21)
    ttft, e2e = queue(22, sent, 1.4 / RATE)
    ids = np.arange(N)
    bare = ArmSamples(
        requests=N, ttft_ms=ttft, itl_ms=np.full(N, 20.0), e2e_ms=e2e, ids={"ttft": ids}
    )
    ref = engine(23, sent, 0.5)
    notes: list[str] = []
    checks = saturation_checks(scenario(ref, bare), notes, offered_rate=RATE)
    assert [c.id for c in checks] == ["steady.saturation.candidate"]
    assert any("approximated from its request ids at the offered 4/s" in n for n in notes)
    g = queue_growth(bare, "candidate", offered_rate=RATE)
    assert g is not None and g.time_basis == "ids" and g.completions == "e2e"


def test_without_send_times_or_rate_only_a_several_fold_rise_counts() -> None:
    sent = arrivals(24)
    ttft, _ = queue(25, sent, 1.5 / RATE)
    bare = ArmSamples(requests=N, ttft_ms=ttft, itl_ms=np.full(N, 20.0))
    g = queue_growth(bare, "candidate")
    assert g is not None and g.time_basis == "position" and not g.seconds
    assert g.slope is None and g.served_share is None and g.saturated
    notes: list[str] = []
    checks = saturation_checks(scenario(engine(26, sent, 0.5), bare), notes)
    assert [c.id for c in checks] == ["steady.saturation.candidate"]
    assert checks[0].candidate is None and checks[0].threshold is None
    assert any("in requests, so throughput and slope were not read" in n for n in notes)
    # a drift of 50% with a clear trend is not several-fold
    drift = 150.0 * np.linspace(1.0, 1.5, N) * np.random.default_rng(27).lognormal(0, 0.1, N)
    g = queue_growth(ArmSamples(requests=N, ttft_ms=drift, itl_ms=drift), "candidate")
    assert g is not None and g.trend and not g.saturated


def test_first_tokens_stand_in_for_completions_without_e2e() -> None:
    sent = arrivals(28)
    ttft, _ = queue(29, sent, 1.3 / RATE)
    only = ArmSamples(requests=N, ttft_ms=ttft, itl_ms=np.full(N, 20.0), offsets_s={"ttft": sent})
    g = queue_growth(only, "candidate")
    assert g is not None and g.completions == "first_token" and g.saturated
    # the offered rate read from the sends themselves
    assert g.offered_rate == pytest.approx(RATE, rel=0.15)


def test_too_few_samples_are_not_judged_and_said() -> None:
    sent = arrivals(30, n=MIN_REQUESTS - 1)
    few = engine(31, sent, 2.0)
    notes: list[str] = []
    assert saturation_checks(scenario(few, few), notes) == []
    assert len(notes) == 2 and all("was not judged" in n for n in notes)


def test_a_significant_rise_short_of_a_queue_is_a_note() -> None:
    """TTFT doubling over a long scenario (a drift, not a queue): the trend is significant and
    the rise twofold, but the wait gains far less than a tenth of the time and the engine
    completes what it is offered."""
    sent = arrivals(32, n=2000)
    rng = np.random.default_rng(33)
    ttft = 100.0 * np.linspace(1.0, 2.0, sent.size) * rng.lognormal(0.0, 0.1, sent.size)
    ref = arm(sent, 100.0 * rng.lognormal(0.0, 0.1, sent.size))
    notes: list[str] = []
    assert saturation_checks(scenario(ref, arm(sent, ttft)), notes, offered_rate=RATE) == []
    assert len(notes) == 1 and "not called a growing queue" in notes[0]
    assert "s per second, under 0.1" in notes[0]


def test_a_queue_capped_by_client_timeouts_is_still_named() -> None:
    """Requests that would wait more than 30 s time out and leave the queue: the candidate's
    TTFT climbs to the cap late in the scenario, its errors are sent but never served, and the
    growth and the shortfall of completions still name it. (A queue pinned at a short timeout
    from the first quarter on no longer grows: its timeouts are the errors checks' to judge.)"""
    sent = arrivals(40)
    rng = np.random.default_rng(41)
    service = 1.5 / RATE * rng.lognormal(0.0, 0.1, N)
    free, ok = 0.0, np.zeros(N, dtype=bool)
    ttft = np.zeros(N)
    for i in range(N):
        start = max(sent[i], free)
        if start - sent[i] > 30.0:
            continue  # timed out: never served
        ok[i], free = True, start + service[i]
        ttft[i] = (free - sent[i]) * 1000.0
    assert 0.05 < 1.0 - ok.mean() < 0.3
    cand = ArmSamples(
        requests=N,
        ttft_ms=ttft[ok],
        itl_ms=np.full(int(ok.sum()), 20.0),
        errors={"timeout": int((~ok).sum())},
        error_offsets_s=sent[~ok],
        offsets_s={"ttft": sent[ok]},
    )
    checks = saturation_checks(scenario(engine(42, sent, 0.5), cand), [], offered_rate=RATE)
    assert [c.id for c in checks] == ["steady.saturation.candidate"]
    assert checks[0].candidate == pytest.approx(1 / 1.5, abs=0.08)
