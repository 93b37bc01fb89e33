"""Shapes of real traffic built into one schedule (loadgen/traffic.py): mixes by share,
sessions in order, shared prefixes, a trace's hash blocks and its time scaling; and
run_paired sending a later turn after that target's own answer plus the think time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import numpy as np
import pytest

from loadgen.client import Target
from loadgen.prompts import Conversation
from loadgen.runner import run_paired
from loadgen.traffic import Part, build_mix, replay_trace
from loadgen.workload_files import LoggedRequest, TraceRow

EXTRA = {"ignore_eos": True, "temperature": 0.0}


def units(n: int, rate: float = 10.0) -> np.ndarray:
    return np.arange(n, dtype=np.float64) / rate


def test_a_mix_follows_its_shares_and_is_reproducible() -> None:
    parts = [
        Part("synthetic", share=3, prompt_tokens=8),
        Part("long_context", share=1, prompt_tokens=500),
    ]
    a = build_mix(parts, units(4000), seed=5, extra=EXTRA)
    b = build_mix(parts, units(4000), seed=5, extra=EXTRA)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    long = sum(1 for k in a.kinds if k == "long_context") / len(a.kinds)
    assert 0.22 < long < 0.28  # 1 in 4, within 4 standard deviations of 4000 draws
    assert sorted(set(a.prompt_words())) == [8, 500]
    assert [r.request_id for r in a.requests] == list(range(4000))
    assert np.all(np.diff(a.offsets_s) >= 0)


def test_sessions_chain_their_turns_after_think_time() -> None:
    part = Part("sessions", prompt_tokens=6, max_tokens=4, turns=3, think_s=0.5)
    t = build_mix([part], units(5, rate=100), seed=1, extra=EXTRA)
    assert len(t.requests) == 15 and t.sessions == 5 and len(t.later_turns) == 10
    by_id = {r.request_id: r for r in t.requests}
    for r in t.requests:
        if r.parent is None:
            assert r.think_s == 0
            continue
        parent = by_id[r.parent]
        assert parent.request_id < r.request_id and r.think_s == 0.5
        # the earliest it could leave: its parent's offset plus the think time
        assert t.offsets_s[r.request_id] == pytest.approx(t.offsets_s[parent.request_id] + 0.5)
        assert r.prompt != parent.prompt


def test_shared_prefix_groups_and_files_as_parts() -> None:
    prefix = Part("shared_prefix", groups=3, prefix_tokens=40, prompt_tokens=5)
    t = build_mix([prefix], units(30), seed=2, extra=EXTRA)
    heads = {" ".join(r.prompt.split()[:40]) for r in t.requests}
    assert len(heads) == 3 and len({r.prompt for r in t.requests}) == 30
    chats = (Conversation(("a b c", "d e"), ("x " * 50, "y")),)
    logged = (LoggedRequest(1, ({"role": "user", "content": "q r"},), None, 7),)
    mixed = [
        Part("sharegpt", conversations=chats, max_tokens=20, think_s=0.1),
        Part("openai", logged=logged, max_tokens=99),
    ]
    t = build_mix(mixed, units(40), seed=3, extra=EXTRA)
    sharegpt = [r for r, k in zip(t.requests, t.kinds, strict=True) if k == "sharegpt"]
    # a recorded answer sizes its turn's max_tokens, at most the part's
    assert {(r.prompt, r.max_tokens) for r in sharegpt} == {("a b c", 20), ("d e", 1)}
    openai = [r for r, k in zip(t.requests, t.kinds, strict=True) if k == "openai"]
    assert openai and all(r.max_tokens == 7 and r.messages for r in openai)


ROWS = [
    TraceRow(1, 10.0, 20, 4, (7, 8)),
    TraceRow(2, 10.5, 12, 5, (7,)),
    TraceRow(3, 10.25, 30, 6, ()),
    TraceRow(4, 12.0, 8, 3, (9,)),
]


def test_a_trace_shares_its_hash_blocks_and_keeps_its_instants() -> None:
    t = replay_trace(
        ROWS, rate=None, requests=None, duration_s=None, block_tokens=10, seed=0, extra=EXTRA
    )
    assert t.offsets_s.tolist() == [0.0, 0.25, 0.5, 2.0]  # sorted by timestamp
    words = [r.prompt.split() for r in t.requests]
    assert [len(w) for w in words] == [20, 30, 12, 8]
    assert [r.max_tokens for r in t.requests] == [4, 6, 5, 3]
    assert words[0][:10] == words[2][:10]  # block 7, shared
    assert words[0][10:20] != words[2][10:]  # block 8 against the row's own words
    assert words[3] != words[0][:8]
    scaled = replay_trace(
        ROWS, rate=3.0, requests=3, duration_s=None, block_tokens=10, seed=0, extra=EXTRA
    )
    # 4 records at a mean of 3/s: 3 gaps in 1 s, the shape kept; the first 3 taken
    assert scaled.offsets_s.tolist() == pytest.approx([0.0, 0.125, 0.25])
    cut = replay_trace(
        ROWS, rate=None, requests=None, duration_s=1.0, block_tokens=10, seed=0, extra=EXTRA
    )
    assert len(cut.requests) == 3
    with pytest.raises(ValueError, match=r"^requests: the trace holds 4 records, not 5$"):
        replay_trace(
            ROWS, rate=None, requests=5, duration_s=None, block_tokens=10, seed=0, extra=EXTRA
        )
    with pytest.raises(ValueError, match=r"^rate: the trace's records share one instant"):
        replay_trace(
            ROWS[:1], rate=2.0, requests=None, duration_s=None, block_tokens=10, seed=0, extra=EXTRA
        )


def test_a_later_turn_waits_for_that_targets_own_answer_and_think_time(
    sim: Callable[..., contextlib.AbstractContextManager[str]],
) -> None:
    """Two sim targets, one 150 ms slower to first token: each target's later turns leave
    after its own answer plus the think time, so the slower one gets them later."""
    part = Part("sessions", prompt_tokens=6, max_tokens=4, turns=3, think_s=0.2)
    t = build_mix([part], units(3, rate=20), seed=4, extra=EXTRA)
    with sim() as fast_url, sim("--ttft-ms", "150") as slow_url:
        targets = [Target("fast", fast_url, api="chat"), Target("slow", slow_url, api="chat")]
        result = asyncio.run(run_paired(targets, t.requests, offsets_s=t.offsets_s))
    by_target = {name: {r.request_id: r for r in recs} for name, recs in result.records.items()}
    for recs in by_target.values():
        assert all(r.ok for r in recs.values())
        for req in t.requests:
            if req.parent is not None:
                parent_end = recs[req.parent].end_ns
                assert parent_end is not None
                assert recs[req.request_id].intended_ns >= parent_end + 200_000_000
    last = [r.request_id for r in t.requests if r.parent is not None]
    # two turns after 150 ms more each: at least 300 ms later on the slow target
    slack = [by_target["slow"][i].intended_ns - by_target["fast"][i].intended_ns for i in last]
    assert max(slack) >= 250_000_000, slack


def test_a_session_longer_than_1024_turns_keeps_its_own_chain() -> None:
    """Turn 1024 of one session and turn 0 of the next had one provisional id: a later turn
    of the long session was chained to the other session's first answer."""
    long = Conversation(tuple(f"q{k}" for k in range(1026)), tuple(f"a{k}" for k in range(1026)))
    short = Conversation(("hello there",), ("hi",))
    part = Part("sharegpt", conversations=(long, short), think_s=0.001)
    traffic = build_mix([part], np.array([0.0, 1.0245]), seed=1, extra={})
    by_id = {r.request_id: r for r in traffic.requests}
    for r in traffic.requests:
        if r.parent is not None:
            parent = by_id[r.parent].prompt
            assert parent.startswith("q") and int(parent[1:]) == int(r.prompt[1:]) - 1, r
