"""The precise timer: callbacks at exact monotonic instants, in order, never early."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from loadgen import clock
from loadgen.clock import PreciseTimer

# serial: callbacks are checked to fire within half a millisecond of their instants.
pytestmark = pytest.mark.serial

MS = 1_000_000


def _collect(run: float, offsets_ms: list[float], busy_ms: float = 0.0) -> list[tuple[int, int]]:
    """(scheduled, fired) pairs for callbacks at the given offsets from now."""

    async def main() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        timer = PreciseTimer(loop)
        fired: list[tuple[int, int]] = []
        done = loop.create_future()
        start = time.monotonic_ns() + 5 * MS
        for k, off in enumerate(offsets_ms):
            at = start + int(off * MS)

            def cb(at: int = at, last: bool = k == len(offsets_ms) - 1) -> None:
                fired.append((at, time.monotonic_ns()))
                if last:
                    done.set_result(None)

            timer.call_at_ns(at, cb)
        if busy_ms:
            await asyncio.sleep(0)
            end = time.monotonic_ns() + int(busy_ms * MS)
            while time.monotonic_ns() < end:  # a long callback: the loop cannot run timers
                pass
        await asyncio.wait_for(done, run)
        timer.close()
        return fired

    return asyncio.run(main())


def _precise() -> bool:
    async def main() -> bool:
        timer = PreciseTimer(asyncio.get_running_loop())
        try:
            return timer.precise
        finally:
            timer.close()

    return asyncio.run(main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_linux_uses_the_kernel_timer() -> None:
    assert _precise()


def test_callbacks_fire_at_their_instant_in_order_and_never_early() -> None:
    offsets = [0.0, 0.3, 0.3, 1.7, 2.05, 7.0, 7.0, 7.0, 12.5]
    fired = _collect(2.0, offsets)
    assert len(fired) == len(offsets)
    assert [at for at, _ in fired] == sorted(at for at, _ in fired)
    lateness = [got - at for at, got in fired]
    assert min(lateness) >= 0
    if clock._libc is not None:
        # Sub-millisecond: asyncio's own timers are up to a whole millisecond late.
        assert sorted(lateness)[len(lateness) // 2] < 0.5 * MS, lateness


def test_added_out_of_order_still_fires_in_time_order() -> None:
    fired = _collect(2.0, [9.0, 1.0, 5.0, 3.0])
    assert [at for at, _ in fired] == sorted(at for at, _ in fired)


def test_callbacks_due_during_a_busy_loop_fire_right_after_it() -> None:
    fired = _collect(2.0, [0.0, 1.0, 2.0], busy_ms=20.0)
    assert len(fired) == 3
    assert all(got >= at for at, got in fired)
    # All three were due while the loop was busy: they fire together in one pass.
    assert fired[-1][1] - fired[0][1] < 2 * MS


def test_without_the_kernel_timer_asyncio_timers_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_libc", None)
    assert not _precise()
    fired = _collect(2.0, [0.0, 2.0, 4.0])
    assert len(fired) == 3 and all(got >= at for at, got in fired)


def test_a_failing_callback_does_not_strand_the_others() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx["exception"]))
        timer = PreciseTimer(loop)
        out: list[int] = []
        at = time.monotonic_ns() + 2 * MS

        def boom() -> None:
            raise RuntimeError("boom")

        timer.call_at_ns(at, boom)
        timer.call_at_ns(at, lambda: out.append(1))
        await asyncio.sleep(0.02)
        timer.close()
        assert len(errors) == 1
        return out

    assert asyncio.run(main()) == [1]


def test_close_drops_pending_callbacks() -> None:
    async def main() -> list[int]:
        timer = PreciseTimer(asyncio.get_running_loop())
        out: list[int] = []
        timer.call_at_ns(time.monotonic_ns() + 5 * MS, lambda: out.append(1))
        timer.close()
        await asyncio.sleep(0.02)
        return out

    assert asyncio.run(main()) == []
