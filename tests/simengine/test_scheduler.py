"""The continuous-batching rules and the cost model, without a clock."""

from __future__ import annotations

import pytest

from simengine.scheduler import Scheduler, SeqState, SeqStatus
from simengine.timing import CostModel, StepTimer


def seq(prompt: int, at: int = 0) -> SeqState:
    return SeqState(prompt_len=prompt, submitted_ns=at)


def sched(seqs: int = 8, budget: int = 100, kv: int = 0) -> Scheduler[SeqState]:
    return Scheduler(max_num_seqs=seqs, max_num_batched_tokens=budget, kv_cache_tokens=kv)


def step(s: Scheduler[SeqState], now: int = 0) -> tuple[list[tuple[SeqState, int]], list[SeqState]]:
    plan = s.schedule(now)
    sampled = s.complete(plan)
    return plan.scheduled, sampled


def test_prefill_then_one_token_per_step() -> None:
    s = sched()
    a = seq(10)
    s.add(a)
    scheduled, sampled = step(s)
    assert scheduled == [(a, 10)]
    assert sampled == [a]  # the prefill step samples the first token
    for _ in range(3):
        scheduled, sampled = step(s)
        assert scheduled == [(a, 1)]
        assert sampled == [a]
    assert a.num_computed == 13
    assert a.num_tokens == 14
    assert s.kv_used == 13


def test_a_remotely_prefilled_prompt_takes_kv_room_but_computes_only_its_last_position() -> None:
    s = sched(budget=100, kv=200)
    a = SeqState(prompt_len=150, submitted_ns=0, remote_kv=149)  # a disaggregated decode
    s.add(a)
    plan = s.schedule(0)
    assert plan.scheduled == [(a, 1)] and plan.num_tokens == 1  # not chunked over 2 steps
    assert (s.kv_used, plan.kv_tokens, a.remote_kv) == (150, 150, 0)
    assert s.complete(plan) == [a]  # its first token in the first step
    # No room for a second one's KV: it waits, as a local prefill would.
    b = SeqState(prompt_len=60, submitted_ns=0, remote_kv=59)
    s.add(b)
    assert step(s)[0] == [(a, 1)] and b.status is SeqStatus.WAITING
    # Preempted, its KV is its own: recomputed locally, in chunks.
    s.remove(a)
    assert step(s)[0] == [(b, 1)]
    victim = s._preempt_newest()
    assert victim is b and (b.num_computed, b.remote_kv, s.kv_used) == (0, 0, 0)
    assert step(s)[0] == [(b, 61)]


def test_long_prompts_are_chunked_and_decodes_go_first() -> None:
    s = sched(budget=100)
    short = seq(5)
    s.add(short)
    step(s)
    long = seq(250)
    s.add(long)
    plan = s.schedule(0)
    assert plan.scheduled == [(short, 1), (long, 99)]
    assert (plan.num_tokens, plan.prefill_tokens) == (100, 99)
    assert s.complete(plan) == [short]  # the long prompt samples nothing yet
    assert [n for _, n in step(s)[0]] == [1, 99]
    scheduled, sampled = step(s)
    assert scheduled == [(short, 1), (long, 52)]
    assert sampled == [short, long]


def test_max_num_seqs_queues_the_rest_in_order() -> None:
    s = sched(seqs=2)
    seqs = [seq(3) for _ in range(4)]
    for q in seqs:
        s.add(q)
    scheduled, _ = step(s)
    assert [q for q, _ in scheduled] == seqs[:2]
    assert (len(s.running), len(s.waiting)) == (2, 2)
    s.remove(seqs[0])
    scheduled, _ = step(s)
    assert [q for q, _ in scheduled] == [seqs[1], seqs[2]]
    assert list(s.waiting) == [seqs[3]]


def test_requests_newer_than_the_step_wait() -> None:
    s = sched()
    early, late = seq(3, at=100), seq(3, at=200)
    s.add(early)
    s.add(late)
    scheduled, _ = step(s, now=150)
    assert [q for q, _ in scheduled] == [early]
    assert list(s.waiting) == [late]


def test_full_kv_cache_preempts_the_newest_and_recomputes_it() -> None:
    s = sched(budget=100, kv=24)
    a, b = seq(10), seq(10)
    s.add(a)
    s.add(b)
    step(s)  # both prefilled: 20 tokens in the cache
    step(s)  # one decode each: 22
    step(s)  # 24: full
    assert s.kv_used == 24
    plan = s.schedule(0)
    assert plan.preempted == [b]
    assert plan.scheduled == [(a, 1)]
    assert b.status is SeqStatus.WAITING
    assert (b.num_computed, b.preemptions, s.num_preemptions) == (0, 1, 1)
    assert s.kv_usage == pytest.approx(13 / 24)
    s.complete(plan)
    s.remove(a)  # a finishes: b is recomputed, prompt plus its three tokens
    plan = s.schedule(0)
    assert plan.scheduled == [(b, 13)]
    assert s.complete(plan) == [b]


def test_remove_frees_kv_and_slots_wherever_the_sequence_is() -> None:
    s = sched(seqs=1)
    a, b = seq(4), seq(4)
    s.add(a)
    s.add(b)
    step(s)
    s.remove(b)
    s.remove(a)
    assert not s.has_work()
    assert s.kv_used == 0
    assert a.status is b.status is SeqStatus.FINISHED


def test_step_cost_follows_a_roofline() -> None:
    cost = CostModel(
        itl_ms=5, itl_per_running_ms=0.5, step_us_per_kv_token=0.1, prefill_us_per_token=20,
        ttft_ms=0, jitter=0,
    )  # fmt: skip
    timer = StepTimer(cost)
    assert timer.step_ns(1, 1, 0, 0) == 5_000_000  # memory-bound decode
    assert timer.step_ns(3, 3, 0, 0) == 6_000_000  # plus CPU per extra sequence
    assert timer.step_ns(1, 1, 10_000, 0) == 6_000_000  # KV reads add to the memory time
    assert timer.step_ns(1, 200, 0, 0) == 5_000_000  # a short prefill hides under the weights
    assert timer.step_ns(1, 500, 0, 0) == 10_000_000  # a long one is compute-bound
    assert timer.step_ns(2, 500, 10_000, 0) == 10_500_000
    assert timer.first_token_floor_ns(100) == 0  # --ttft-ms 0: no floor


def test_kv_transfer_time_grows_with_the_prompt() -> None:
    timer = StepTimer(CostModel(kv_transfer_ms=2, kv_transfer_us_per_token=3, jitter=0.5))
    assert timer.kv_transfer_ns(0) == 2_000_000
    assert timer.kv_transfer_ns(1000) == 5_000_000  # no jitter: a lower bound tests can use
    assert StepTimer(CostModel()).kv_transfer_ns(1000) == 0


def test_ttft_floor_jitter_and_degradation() -> None:
    timer = StepTimer(CostModel(ttft_ms=40, prefill_us_per_token=50, jitter=0))
    assert timer.first_token_floor_ns(100) == 45_000_000
    jittered = StepTimer(CostModel(itl_ms=10, itl_per_running_ms=0, jitter=0.03), seed=1)
    steps = [jittered.step_ns(1, 0, 0, 0) for _ in range(200)]
    assert len(set(steps)) > 100
    assert 9_000_000 < sorted(steps)[100] < 11_000_000
    slowing = StepTimer(
        CostModel(itl_ms=10, itl_per_running_ms=0, jitter=0, degrade_itl_per_min=50),
        origin_ns=1_000,
    )
    assert slowing.step_ns(1, 0, 0, 1_000) == 10_000_000
    assert slowing.step_ns(1, 0, 0, 1_000 + 60_000_000_000) == 15_000_000
    assert slowing.step_ns(1, 0, 0, 1_000 + 120_000_000_000) == 20_000_000
    assert slowing.ttft_degradation(1_000 + 60_000_000_000) == 1.0  # ITL creep only
    creeping = StepTimer(CostModel(jitter=0, degrade_ttft_per_min=40), origin_ns=1_000)
    assert creeping.ttft_degradation(0) == 1.0
    assert creeping.ttft_degradation(1_000 + 30_000_000_000) == pytest.approx(1.2)
    assert creeping.step_ns(1, 0, 0, 1_000 + 60_000_000_000) == creeping.step_ns(1, 0, 0, 1_000)
