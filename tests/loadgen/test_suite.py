"""The scenario suite builds reproducibly; probes and greedy checks run against the real sim."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from loadgen import Target
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
