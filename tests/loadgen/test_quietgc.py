"""The heap freeze that keeps collector pauses out of timed runs."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from loadgen import RequestSpec, Target, build_offsets, quietgc, run_paired, synthetic_prompts


def test_frozen_heap_freezes_and_gives_back_only_when_the_last_run_ends() -> None:
    gc.unfreeze()
    keep = [[i] for i in range(1000)]
    with quietgc.frozen_heap():
        outer = gc.get_freeze_count()
        assert outer >= len(keep)
        with quietgc.frozen_heap():
            assert quietgc.active_runs() == 2
            more = [[i] for i in range(500)]
            quietgc.refreeze()
            assert gc.get_freeze_count() >= outer + len(more)
        assert quietgc.active_runs() == 1
        assert gc.get_freeze_count() >= outer  # the inner run did not thaw the outer one's heap
    assert quietgc.active_runs() == 0
    assert gc.get_freeze_count() == 0


def test_refreeze_outside_a_run_does_nothing() -> None:
    gc.unfreeze()
    quietgc.refreeze()
    assert gc.get_freeze_count() == 0


def test_concurrent_runs_in_threads_balance() -> None:
    gc.unfreeze()
    barrier = threading.Barrier(4)

    def run() -> None:
        with quietgc.frozen_heap():
            barrier.wait()
            quietgc.refreeze()
            barrier.wait()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert quietgc.active_runs() == 0
    assert gc.get_freeze_count() == 0


def test_a_paired_run_is_timed_with_the_heap_frozen(stream_server: Any) -> None:
    gc.unfreeze()
    counts: list[int] = []
    prompts = synthetic_prompts(6, 8, seed=3)
    requests = [RequestSpec(i, p, 2, {}) for i, p in enumerate(prompts)]

    async def main() -> None:
        async with stream_server() as a:
            await run_paired(
                [Target("ref", a.url)],
                requests,
                offsets_s=build_offsets("constant", 100.0, requests=len(requests)),
                on_record=lambda _: counts.append(gc.get_freeze_count()),
            )

    asyncio.run(main())
    assert len(counts) == len(requests)
    assert min(counts) > 0
    assert gc.get_freeze_count() == 0
