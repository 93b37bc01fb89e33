"""Mirror one request schedule onto several targets at the same instants.

A deploy gate compares a reference and a candidate engine. Sending both the same requests at the
same moments turns the comparison into a paired one: the load each engine sees is identical up to
microseconds, so differences between them are the engines' and not the schedule's, and the
statistics can work on per-request differences, which have far less noise than two independent
runs.

Open loop (``offsets_s``): request ``i`` is started on every target at ``start + offsets_s[i]``,
measured on the monotonic clock. The tasks for one request are created back to back and nothing
waits for a response before the next send, so a slow engine can never delay the schedule
(no coordinated omission); the gap between intended and actual send is recorded as dispatch
delay.

Closed loop (``concurrency``): ``concurrency`` slots; a slot takes the next request, sends it to
every target at once, and takes another only when every target has answered. Each target
therefore sees at most ``concurrency`` requests in flight and the same request sequence, but a
faster target idles while it waits for the slower one: the offered load follows the slower
engine, which keeps the pair comparable, rather than letting each engine run at its own pace.
In closed loop ``intended_ns`` is the instant the slot took the request, so dispatch delay is the
client's own queueing between a free slot and the request leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.lowlevel
import httpx
import numpy as np
import numpy.typing as npt

from loadgen import quietgc
from loadgen.client import Message, RequestSpec, Target, conversation, make_client, send_request
from loadgen.records import RequestRecord


@dataclass(frozen=True, slots=True)
class Pause:
    """Hold an open-loop schedule before request number `index` (its position in the run's
    requests) until `go` resolves: True sends on, with every later send time moved by the
    pause so the schedule resumes at its own pace instead of bursting to catch up; False ends
    the run there. A deploy gate uses it to decide, after a scenario's planned requests, whether
    to run its extension, without sending extension requests it would then not judge."""

    index: int
    go: asyncio.Future[bool]


@dataclass(slots=True)
class PairedResult:
    """Per-target records of one paired run, each list sorted by ``request_id``."""

    start_ns: int
    end_ns: int
    records: dict[str, list[RequestRecord]]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def aligned(self) -> Iterator[tuple[int, dict[str, RequestRecord]]]:
        """``(request_id, {target: record})`` for every request that every target finished.

        Requests a stopped run finished on only some targets are left out: a pair with a
        missing side cannot be compared.
        """
        by_target = {name: {r.request_id: r for r in recs} for name, recs in self.records.items()}
        if not by_target:
            return
        common = set.intersection(*(set(m) for m in by_target.values()))
        for request_id in sorted(common):
            yield request_id, {name: m[request_id] for name, m in by_target.items()}


async def run_paired(
    targets: Sequence[Target],
    requests: Sequence[RequestSpec],
    *,
    offsets_s: npt.NDArray[np.float64] | None = None,
    concurrency: int | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    stop: asyncio.Event | None = None,
    clients: Mapping[str, httpx.AsyncClient] | None = None,
    warmup: Sequence[RequestSpec] = (),
    start_ns: int | None = None,
    pause: Pause | None = None,
) -> PairedResult:
    """Drive every target with the same requests; give exactly one of ``offsets_s`` (open loop)
    or ``concurrency`` (closed loop).

    ``on_record`` sees each record as it finishes (progress bars, live JSONL). Setting ``stop``
    cancels everything in flight and returns what had finished. ``clients`` lets the caller
    reuse warmed-up connections (keyed by target name; left open; size their pools to the run
    with ``make_client``, or requests will queue inside httpx before any timestamp sees them);
    otherwise one client per target is made with a pool as large as the run can ever need, and
    closed at the end.

    ``warmup`` requests go to every target at once before the clock starts and are discarded
    (use prompts the run does not, or the engines' prefix caches will flatter the run).

    ``start_ns`` fixes the schedule's zero on the monotonic clock (``time.monotonic_ns()``)
    instead of "now": worker processes sharing one schedule all pass the same instant, which
    is valid across processes because the monotonic clock is system-wide.

    A request with a ``parent`` (a conversation's next turn) waits, on each target, for that
    target's answer to its parent and is then sent with the conversation so far. Its intended
    time is the later of its scheduled instant and the parent's last byte, so dispatch delay
    still measures only the client. A turn with ``think_s`` waits that long after its parent's
    answer too (a user reading it): later turns follow each engine's own pace.
    """
    _validate(targets, requests, offsets_s, concurrency, clients, pause)
    flight = _Flight()
    # Open loop can in the worst case have every request in flight at once; closed loop never
    # more than its slots. A pool this size means httpx itself never queues a request.
    need = max(1, len(requests) if concurrency is None else concurrency)
    # Open loop: requests are built ahead and fired on time.
    sender = _Sender(targets, requests, on_record, armed=offsets_s is not None)

    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(quietgc.frozen_heap())
        pool = await _client_pool(stack, targets, clients, need)
        # httpcore imports anyio's asyncio backend inside the first request (~70 ms on two
        # cores), which would make the first target's first send late against the second's.
        await anyio.lowlevel.checkpoint()
        if warmup:
            await _warm_up(targets, warmup, pool)
        watcher = None
        if stop is not None:
            if stop.is_set():
                flight.abort.set()
            watcher = asyncio.create_task(_forward(stop, flight.abort))
        if start_ns is None:
            start_ns = time.monotonic_ns()
        try:
            if offsets_s is not None:
                await _open_loop(
                    targets, requests, offsets_s, start_ns, pool, flight, sender.one, pause
                )
            else:
                assert concurrency is not None
                await _closed_loop(targets, requests, concurrency, pool, flight, sender.one)
            await flight.settle()
        finally:
            await flight.cancel_all()
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        end_ns = time.monotonic_ns()
    if flight.error is not None:
        raise flight.error
    for recs in sender.records.values():
        recs.sort(key=lambda r: r.request_id)
    return PairedResult(start_ns=start_ns, end_ns=end_ns, records=sender.records)


class _Sender:
    """Sends one request to one target and files its record; a conversation's next turn
    waits, on each target, for that target's answer to its parent (`run_paired`)."""

    def __init__(
        self,
        targets: Sequence[Target],
        requests: Sequence[RequestSpec],
        on_record: Callable[[RequestRecord], None] | None,
        *,
        armed: bool,
    ) -> None:
        self.records: dict[str, list[RequestRecord]] = {t.name: [] for t in targets}
        self.parents = {r.parent for r in requests if r.parent is not None}
        self.turns: dict[tuple[str, int], asyncio.Future[tuple[list[Message], int]]] = {}
        self.finished = 0
        self.on_record = on_record
        self.armed = armed

    def turn(self, name: str, request_id: int) -> asyncio.Future[tuple[list[Message], int]]:
        key = (name, request_id)
        if key not in self.turns:
            self.turns[key] = asyncio.get_running_loop().create_future()
        return self.turns[key]

    async def one(
        self, client: httpx.AsyncClient, target: Target, req: RequestSpec, at: int
    ) -> None:
        history: list[Message] = []
        if req.parent is not None:
            history, parent_end = await self.turn(target.name, req.parent)
            at = max(at, parent_end + round(req.think_s * 1e9))
        record = await send_request(client, target, req, at, history=history, armed=self.armed)
        if req.request_id in self.parents:
            answer = {"role": "assistant", "content": record.text}
            ended = record.end_ns if record.end_ns is not None else time.monotonic_ns()
            self.turn(target.name, req.request_id).set_result(
                ([*conversation(req, history), answer], ended)
            )
        self.records[target.name].append(record)
        self.finished += 1
        if self.finished % _REFREEZE_EVERY == 0:
            quietgc.refreeze()
        if self.on_record is not None:
            self.on_record(record)


async def _client_pool(
    stack: contextlib.AsyncExitStack,
    targets: Sequence[Target],
    clients: Mapping[str, httpx.AsyncClient] | None,
    need: int,
) -> dict[str, httpx.AsyncClient]:
    """The caller's clients, or one per target sized to `need`, closed with `stack`."""
    pool: dict[str, httpx.AsyncClient] = {}
    for target in targets:
        if clients is not None:
            pool[target.name] = clients[target.name]
        else:
            pool[target.name] = await stack.enter_async_context(make_client(target, need))
    return pool


_LEAD_NS = 5_000_000
_REFREEZE_EVERY = 1000  # finished records between freezes (see loadgen.quietgc)

_One = Callable[[httpx.AsyncClient, Target, RequestSpec, int], Coroutine[Any, Any, None]]


async def _open_loop(
    targets: Sequence[Target],
    requests: Sequence[RequestSpec],
    offsets_s: npt.NDArray[np.float64],
    start_ns: int,
    pool: Mapping[str, httpx.AsyncClient],
    flight: _Flight,
    one: _One,
    pause: Pause | None = None,
) -> None:
    due = start_ns + np.rint(np.asarray(offsets_s, dtype=np.float64) * 1e9).astype(np.int64)
    shift = 0
    for i, (req, planned_at) in enumerate(zip(requests, due.tolist(), strict=True)):
        if pause is not None and i == pause.index:
            if not await flight.until(pause.go):
                return
            shift = max(0, time.monotonic_ns() + _LEAD_NS - planned_at)
        at = planned_at + shift
        # Wake a little ahead of the instant, or on abort, and start the request's tasks: they
        # build the request and take a connection now, and the transport writes the bytes at
        # the instant itself on a precise timer (``loadgen.clock``). asyncio's own timers are
        # whole milliseconds late, and building a request in httpx takes a few hundred
        # microseconds more; ``_LEAD_NS`` covers both with room for a busy loop.
        while (wait_ns := at - _LEAD_NS - time.monotonic_ns()) > 0:
            if await flight.aborted_within(wait_ns / 1e9):
                return
        if flight.abort.is_set():
            return
        for target in _rotated(targets, i):
            flight.spawn(one(pool[target.name], target, req, at))


async def _closed_loop(
    targets: Sequence[Target],
    requests: Sequence[RequestSpec],
    concurrency: int,
    pool: Mapping[str, httpx.AsyncClient],
    flight: _Flight,
    one: _One,
) -> None:
    queue = enumerate(requests)  # shared by every slot; asyncio cannot interleave a next()

    async def slot() -> None:
        for i, req in queue:
            if flight.abort.is_set():
                return
            at = time.monotonic_ns()
            sends = [
                asyncio.create_task(one(pool[t.name], t, req, at)) for t in _rotated(targets, i)
            ]
            try:
                await asyncio.gather(*sends)
            finally:
                # gather does not cancel siblings when one fails; never leave orphans behind.
                for send in sends:
                    send.cancel()
                await asyncio.gather(*sends, return_exceptions=True)

    for _ in range(min(concurrency, len(requests))):
        flight.spawn(slot())


def _rotated(targets: Sequence[Target], i: int) -> list[Target]:
    """Targets in an order that rotates per request.

    The target whose task starts first leaves a fraction of a millisecond earlier, and when
    answers arrive together, the one whose read is handled first gets the earlier stamp.
    Rotating the order makes those small client effects fall on every target equally instead
    of always favouring the first, which would bias a paired comparison.
    """
    k = i % len(targets)
    return [*targets[k:], *targets[:k]]


async def _warm_up(
    targets: Sequence[Target], warmup: Sequence[RequestSpec], pool: Mapping[str, httpx.AsyncClient]
) -> None:
    """Open connections and touch every code path once; failures show up in the real run."""
    now = time.monotonic_ns()
    await asyncio.gather(
        *(send_request(pool[t.name], t, req, now) for req in warmup for t in targets)
    )


async def _forward(source: asyncio.Event, sink: asyncio.Event) -> None:
    await source.wait()
    sink.set()


class _Flight:
    """Tasks in flight, an abort signal, and the first unexpected failure.

    A counter and events rather than ``asyncio.wait`` over every task keep the bookkeeping O(1)
    per request: an open-loop run can have thousands of tasks outstanding.
    """

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.abort = asyncio.Event()
        self.error: BaseException | None = None

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        self.idle.clear()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None and self.error is None:
                self.error = exc
                self.abort.set()
        if not self.tasks:
            self.idle.set()

    async def until(self, go: asyncio.Future[bool]) -> bool:
        """The future's answer, or False if the run is aborted first."""
        if not go.done():
            abort = asyncio.ensure_future(self.abort.wait())
            waiters: set[asyncio.Future[Any]] = {go, abort}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                abort.cancel()
        if self.abort.is_set() or not go.done() or go.cancelled():
            return False
        return bool(go.result())

    async def aborted_within(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self.abort.wait()
        except TimeoutError:
            return False
        return True

    async def settle(self) -> None:
        """Wait until every task has finished or the run is aborted."""
        if self.idle.is_set() or self.abort.is_set():
            return
        waiters = [asyncio.create_task(self.idle.wait()), asyncio.create_task(self.abort.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def cancel_all(self) -> None:
        pending = list(self.tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _validate(
    targets: Sequence[Target],
    requests: Sequence[RequestSpec],
    offsets_s: npt.NDArray[np.float64] | None,
    concurrency: int | None,
    clients: Mapping[str, httpx.AsyncClient] | None,
    pause: Pause | None = None,
) -> None:
    if not targets:
        raise ValueError("targets: need at least one target")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"targets: names must be unique, got {names}")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("requests: request_id values must be unique")
    seen: set[int] = set()
    for r in requests:
        if r.parent is not None and r.parent not in seen:
            raise ValueError(
                f"requests: request {r.request_id} names parent {r.parent}, which is not an "
                "earlier request of the run"
            )
        seen.add(r.request_id)
    if (offsets_s is None) == (concurrency is None):
        raise ValueError("offsets_s/concurrency: give exactly one of offsets_s or concurrency")
    if offsets_s is not None:
        arr = np.asarray(offsets_s, dtype=np.float64)
        if arr.ndim != 1 or len(arr) != len(requests):
            raise ValueError(
                f"offsets_s: need one offset per request ({len(requests)}), got shape {arr.shape}"
            )
        if len(arr) and (not np.all(np.isfinite(arr)) or arr[0] < 0 or np.any(np.diff(arr) < 0)):
            raise ValueError("offsets_s: must be finite, non-negative and sorted")
    if concurrency is not None and (isinstance(concurrency, bool) or concurrency < 1):
        raise ValueError(f"concurrency: must be an integer >= 1, got {concurrency!r}")
    if clients is not None:
        missing = [n for n in names if n not in clients]
        if missing:
            raise ValueError(f"clients: no client for targets {missing}")
    if pause is not None and (offsets_s is None or not 0 < pause.index < len(requests)):
        raise ValueError(
            f"pause: needs an open-loop schedule and 0 < index < {len(requests)}, "
            f"got index {pause.index}"
        )
