"""Sharding one schedule over worker processes merges to exactly a one-process run."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen import RequestSpec, Target, build_offsets, synthetic_prompts
from loadgen.workers import run_sharded, shard_of


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(i, p, 3) for i, p in enumerate(synthetic_prompts(n, 6, seed=2))]


def test_shards_keep_conversations_together() -> None:
    reqs = [
        RequestSpec(0, "a", 1),
        RequestSpec(1, "b", 1),
        RequestSpec(2, "a2", 1, parent=0),
        RequestSpec(3, "c", 1),
        RequestSpec(4, "a3", 1, parent=2),
    ]
    assert shard_of(reqs, 2) == [0, 1, 0, 0, 0]
    assert shard_of(specs(7), 3) == [0, 1, 2, 0, 1, 2, 0]


def test_two_workers_send_every_request_once_at_the_shared_instants(threaded_server) -> None:  # type: ignore[no-untyped-def]
    n = 40
    offsets = build_offsets("constant", 100.0, requests=n)
    progress: list[tuple[int, int]] = []
    targets = [Target("a", threaded_server.url), Target("b", threaded_server.url)]
    result = run_sharded(
        targets,
        specs(n),
        workers=2,
        offsets_s=offsets,
        on_progress=lambda d, e: progress.append((d, e)),
    )
    for name in ("a", "b"):
        recs = result.records[name]
        assert [r.request_id for r in recs] == list(range(n))  # each once, merged in order
        assert all(r.ok for r in recs), [r.error_message for r in recs if not r.ok]
        intended = (np.array([r.intended_ns for r in recs]) - result.start_ns) / 1e9
        np.testing.assert_allclose(intended, offsets, atol=1e-6)
    assert len(threaded_server.server.received) == 2 * n
    ids = sorted(int(r.request_id) for r in threaded_server.server.received)
    assert ids == sorted(list(range(n)) * 2)
    assert progress and progress[-1][0] == 2 * n


def test_closed_loop_split_and_validation(threaded_server) -> None:  # type: ignore[no-untyped-def]
    result = run_sharded([Target("a", threaded_server.url)], specs(12), workers=2, concurrency=3)
    assert [r.request_id for r in result.records["a"]] == list(range(12))
    with pytest.raises(ValueError, match="workers"):
        run_sharded([Target("a", "http://h:1")], specs(2), workers=3, concurrency=2)
    with pytest.raises(ValueError, match="offsets_s/concurrency"):
        run_sharded([Target("a", "http://h:1")], specs(2), workers=2)
