"""The periodic sampler: every `interval_s`, each role's sources read on a daemon thread
beside the load, into one `Timeline` per role on the gate's monotonic clock.

Why a thread, not a task on the load's event loop: a scrape parses tens of kilobytes (a
real vLLM's /metrics is 54 kB), which on the loop would delay the load's own reads and bias
the TTFT it measures (bench/telemetry_cost.py measures what the thread costs). Each source
read runs under the sampler's deadline: one that fails or raises is a gap (`Timeline.gaps`,
with the first reason as a note), one that outlasts the tick is simply late, and the sampler
never raises into the gate. Bounded: at most `max_points` ticks are kept per scenario (at
the default 1 s, an hour), past which it stops with a note.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from gate.telemetry.source import Sample, Source, Timeline

__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_MAX_POINTS", "Sampler"]

DEFAULT_INTERVAL_S = 1.0
DEFAULT_MAX_POINTS = 3_600


class Sampler:
    """Reads `sources` (role -> its sources) every `interval_s` from `start()` to `stop()`."""

    def __init__(
        self,
        sources: Mapping[str, Sequence[Source]],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_points: int = DEFAULT_MAX_POINTS,
        zero_ns: int | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.sources = {role: list(s) for role, s in sources.items()}
        self.interval_s = interval_s
        self.max_points = max_points
        self._clock = clock_ns
        self._zero = zero_ns if zero_ns is not None else clock_ns()
        self.timelines = {
            role: Timeline(role, [s.name for s in srcs], interval_s)
            for role, srcs in self.sources.items()
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_s = 0.0  # the sampler thread's own CPU time, for the cost bench

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Timeline]:
        """One last scrape (the scenario's end state), then the timelines."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10.0)
            self._thread = None
        for srcs in self.sources.values():
            for src in srcs:
                close = getattr(src, "close", None)
                if callable(close):
                    close()
        return self.timelines

    def tick(self) -> None:
        """One scrape of every source (the thread's body; tests call it directly). Each role's
        reads are stamped at the middle of the time they took, not at the tick's start: the
        roles are read one after the other, and on a busy host one role's reads (a metrics
        page, an `nvidia-smi` process) can take seconds, so the next role's values are that
        much younger than the tick (an energy counter read 2 s late is 2 s of idle power
        more)."""
        for role, srcs in self.sources.items():
            tl = self.timelines[role]
            if len(tl.t_s) >= self.max_points:
                tl.note(f"sampling stopped after {self.max_points} scrapes")
                continue
            samples: list[Sample] = []
            failed = False
            began = self._clock()
            for src in srcs:
                try:
                    samples.extend(src.read())
                except Exception as exc:  # any failure of a source is a gap
                    failed = True
                    tl.note(f"{src.name}: {exc}"[:200])
            at_s = ((began + self._clock()) / 2 - self._zero) / 1e9
            tl.add(at_s, samples, failed)

    def _run(self) -> None:
        start_cpu = time.thread_time()
        next_at = time.monotonic()
        while True:
            self.tick()
            self.cpu_s = time.thread_time() - start_cpu
            if self._stop.is_set():
                return
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                self.tick()  # the end state
                self.cpu_s = time.thread_time() - start_cpu
                return
