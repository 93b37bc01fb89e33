"""One schedule, sharded over worker processes that send at the same absolute instants.

A single Python process tops out somewhere (around a thousand simple requests/s, far fewer
long streams); guidellm, AIPerf and inference-perf all scale with processes. Here every worker
gets a deterministic share of the requests (whole conversations together, so a follow-up turn
is in the same process as its parent), builds its own clients and event loop, warms up, and
reports ready. The parent then fixes one start instant on the monotonic clock, which Linux
keeps system-wide, and every worker runs :func:`loadgen.runner.run_paired` with that
``start_ns``: request ``i`` leaves at ``start + offsets_s[i]`` whichever process sends it.

Records are plain dataclasses; they come back pickled and are merged by ``request_id``, so a
sharded run's records are exactly a single-process run's, each request once per target.
Workers are started with ``spawn``: forking a process that already has an event loop, open
sockets or threads is not safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from loadgen.client import RequestSpec, Target, make_client
from loadgen.records import RequestRecord
from loadgen.runner import PairedResult, run_paired

_READY_TIMEOUT_S = 120.0
_PROGRESS_S = 0.1
_LEAD_NS = 100_000_000
"""Time between the parent fixing the start and the first send: every worker must be waiting
by then, or its first requests leave late (its dispatch delay would show it)."""

Progress = Callable[[int, int], None]
"""Called in the parent with the running totals (records finished, records failed)."""


def shard_of(requests: Sequence[RequestSpec], workers: int) -> list[int]:
    """The worker of each request: round-robin over conversations (a request and its parent
    chain share one), so every worker gets an even, interleaved slice of the schedule."""
    root: dict[int, int] = {}
    order: dict[int, int] = {}
    shards: list[int] = []
    for r in requests:
        base = root[r.parent] if r.parent is not None else r.request_id
        root[r.request_id] = base
        if base not in order:
            order[base] = len(order)
        shards.append(order[base] % workers)
    return shards


def run_sharded(
    targets: Sequence[Target],
    requests: Sequence[RequestSpec],
    *,
    workers: int,
    offsets_s: npt.NDArray[np.float64] | None = None,
    concurrency: int | None = None,
    warmup: Sequence[RequestSpec] = (),
    on_progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PairedResult:
    """Run one schedule over ``workers`` processes and merge the records.

    Open loop: each worker sends its share at the shared absolute instants. Closed loop:
    ``concurrency`` slots are split as evenly as possible between workers (each slot still
    waits for every target, as in one process). ``should_stop`` is polled; when it returns
    True the workers stop and what finished is returned.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: must be an integer >= 1, got {workers!r}")
    if (offsets_s is None) == (concurrency is None):
        raise ValueError("offsets_s/concurrency: give exactly one of offsets_s or concurrency")
    if concurrency is not None and concurrency < workers:
        raise ValueError(f"workers: {workers} workers need a concurrency of at least {workers}")
    shards = shard_of(requests, workers)
    offsets = None if offsets_s is None else np.asarray(offsets_s, dtype=np.float64)
    ctx = multiprocessing.get_context("spawn")
    messages: Any = ctx.Queue()
    start_at = ctx.Value("q", 0)
    go = ctx.Event()
    stop = ctx.Event()
    procs = []
    for k in range(workers):
        mine = [i for i, s in enumerate(shards) if s == k]
        share_conc = None
        if concurrency is not None:
            share_conc = concurrency // workers + (1 if k < concurrency % workers else 0)
        share = _Share(
            k,
            list(targets),
            [requests[i] for i in mine],
            None if offsets is None else offsets[mine],
            share_conc,
            list(warmup),
            messages,
            start_at,
            go,
            stop,
        )
        procs.append(ctx.Process(target=_worker, args=(share,), daemon=True, name=f"loadgen-{k}"))
    for proc in procs:
        proc.start()
    try:
        return _collect(procs, messages, start_at, go, stop, targets, on_progress, should_stop)
    finally:
        stop.set()
        go.set()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(1)


def _collect(
    procs: list[Any],
    messages: Any,
    start_at: Any,
    go: Any,
    stop: Any,
    targets: Sequence[Target],
    on_progress: Progress | None,
    should_stop: Callable[[], bool] | None,
) -> PairedResult:
    workers = len(procs)
    ready: set[int] = set()
    done: dict[int, tuple[dict[str, list[RequestRecord]], int, int]] = {}
    progress: dict[int, tuple[int, int]] = {}
    deadline = time.monotonic() + _READY_TIMEOUT_S
    start_ns = 0
    while len(done) < workers:
        if should_stop is not None and should_stop():
            stop.set()
        try:
            message = messages.get(timeout=_PROGRESS_S)
        except queue.Empty:
            dead = [p.name for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
            if dead:
                raise RuntimeError(f"worker process died: {', '.join(dead)}") from None
            if len(ready) < workers and time.monotonic() > deadline:
                raise RuntimeError("workers: not every worker got ready in time") from None
            continue
        kind, k = message[0], message[1]
        if kind == "ready":
            ready.add(k)
            if len(ready) == workers:
                start_ns = time.monotonic_ns() + _LEAD_NS
                start_at.value = start_ns
                go.set()
        elif kind == "progress":
            progress[k] = (message[2], message[3])
            if on_progress is not None:
                on_progress(
                    sum(p[0] for p in progress.values()), sum(p[1] for p in progress.values())
                )
        elif kind == "done":
            done[k] = (message[2], message[3], message[4])
        elif kind == "error":
            raise RuntimeError(f"worker {k} failed:\n{message[2]}")
    merged: dict[str, list[RequestRecord]] = {t.name: [] for t in targets}
    for records, _, _ in done.values():
        for name, recs in records.items():
            merged[name].extend(recs)
    for recs in merged.values():
        recs.sort(key=lambda r: r.request_id)
    end_ns = max((e for _, _, e in done.values()), default=start_ns)
    return PairedResult(start_ns=start_ns, end_ns=end_ns, records=merged)


@dataclass(frozen=True, slots=True)
class _Share:
    """One worker's share of the run, and the parent's queue and signals (sent at spawn)."""

    k: int
    targets: list[Target]
    requests: list[RequestSpec]
    offsets: npt.NDArray[np.float64] | None
    concurrency: int | None
    warmup: list[RequestSpec]
    messages: Any
    start_at: Any
    go: Any
    stop: Any


def _worker(share: _Share) -> None:
    # The parent owns Ctrl-C: it tells every worker to stop, so that what finished comes back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_work(share))
    except BaseException:
        share.messages.put(("error", share.k, traceback.format_exc()))


async def _work(share: _Share) -> None:
    need = max(
        1,
        len(share.requests) if share.concurrency is None else share.concurrency,
        len(share.warmup),
    )
    finished = 0
    failed = 0
    halt = asyncio.Event()

    def on_record(record: RequestRecord) -> None:
        nonlocal finished, failed
        finished += 1
        failed += 0 if record.ok else 1

    async def report() -> None:
        while True:
            share.messages.put(("progress", share.k, finished, failed))
            if share.stop.is_set():
                halt.set()
            await asyncio.sleep(_PROGRESS_S)

    async with contextlib.AsyncExitStack() as stack:
        clients = {
            t.name: await stack.enter_async_context(make_client(t, need)) for t in share.targets
        }
        if share.warmup:
            await run_paired(
                share.targets, share.warmup, concurrency=len(share.warmup), clients=clients
            )
        share.messages.put(("ready", share.k))
        await asyncio.to_thread(share.go.wait)
        if share.stop.is_set():
            return  # the parent gave up before the start
        reporter = asyncio.create_task(report())
        try:
            result = await run_paired(
                share.targets,
                share.requests,
                offsets_s=share.offsets,
                concurrency=share.concurrency,
                on_record=on_record,
                stop=halt,
                clients=clients,
                start_ns=int(share.start_at.value),
            )
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
    share.messages.put(("progress", share.k, finished, failed))
    share.messages.put(("done", share.k, result.records, result.start_ns, result.end_ns))
