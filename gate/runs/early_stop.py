"""Live looks that stop a scenario early.

Live looks (`LiveLooks`): a `SequentialJudge` under the gate's `Plan` looks at the prefix of the
schedule that both engines have finished, every `look_every` requests per arm. A prefix by
request id, not whatever has come back: the requests still in flight at a look are the slow
ones, and judging only the finished ones would flatter the slower engine. Every sequence of the
plan holds at every prefix at once, so the gate may act on any look; when one says the
scenario's verdict cannot change (a check failed, or every check is decided) the scenario stops,
and the final judge is given exactly that prefix, so the verdict is the look's (plus estimate
intervals), never a fixed-sample test run again after an optional stop. Records are turned into
columns in batches and the look runs in a worker thread: the event loop only files records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gate.analysis.samples import (
    Columns,
    columns_from_records,
    concat_columns,
    select_requests,
)
from gate.analysis.sequential import Look, SequentialJudge
from gate.core.vocabulary import ROLES
from gate.verdict.document import (
    EarlyStopDoc,
)
from loadgen.records import RequestRecord


@dataclass(frozen=True)
class EarlyStop:
    """A scenario stopped before the end of its schedule: judged on the schedule's first
    `upto` requests (`requests` per arm after the warm-up) because of `checks`. Reason
    "planned": a scenario that could have extended (policy `extend`) ended at or past its
    planned size because nothing was undecided any more."""

    scenario: str
    requests: int
    planned: int
    upto: int
    reason: Literal["hold", "decided", "planned"]
    checks: tuple[str, ...]

    @property
    def message(self) -> str:
        at = f"{self.requests} of {self.planned} planned requests per arm"
        if self.reason == "planned":
            if self.requests <= self.planned:
                return (
                    f"{self.scenario} ended at its planned {self.planned} requests per arm with "
                    "no check undecided, so it did not need its extension."
                )
            return (
                f"{self.scenario} ended at {self.requests} requests per arm, past its planned "
                f"{self.planned}: it ran on until no check was undecided."
            )
        if self.reason == "hold":
            return (
                f"{self.scenario} stopped early at {at}: {', '.join(self.checks)} failed, and no "
                "more samples could turn the hold into a continue."
            )
        return (
            f"{self.scenario} stopped early at {at}: every check was decided, so more samples "
            "could not change its verdict."
        )

    def describe(self) -> EarlyStopDoc:
        return EarlyStopDoc(
            requests=self.requests,
            planned=self.planned,
            upto=self.upto,
            reason=self.reason,
            checks=list(self.checks),
            message=self.message,
        )


@dataclass
class LiveLooks:
    """Looks at one running scenario (module docstring); `add` is the run's record callback.

    hold_only: stop only on a failed check (scenarios whose load checks, judged at the end, the
    looks do not see); on_stop: called once, on the event loop, when the scenario may stop.
    """

    judge: SequentialJudge
    scenario: str
    warmup: int
    look_every: int
    zero_ns: int
    on_stop: Callable[[EarlyStop], None]
    hold_only: bool = False
    # Resolved by the look at the planned size when the schedule pauses there (loadgen Pause):
    # True runs the extension, False ends the scenario at its plan.
    go: asyncio.Future[bool] | None = None
    looks: int = 0
    stopped: EarlyStop | None = None
    last: Look | None = None
    _next: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    _pending: dict[str, dict[int, RequestRecord]] = field(
        default_factory=lambda: {r: {} for r in ROLES}
    )
    _ready: dict[str, list[RequestRecord]] = field(default_factory=lambda: {r: [] for r in ROLES})
    _cols: dict[str, list[Columns]] = field(default_factory=lambda: {r: [] for r in ROLES})
    _due: int = 0
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._due = min(self.look_every, self.planned)

    @property
    def planned(self) -> int:
        return int(self.judge.plan.requests[self.scenario])

    def add(self, rec: RequestRecord) -> None:
        role = rec.target
        if role not in self._next or self.stopped is not None:
            return
        pending = self._pending[role]
        pending[rec.request_id] = rec
        nxt = self._next[role]
        while nxt in pending:
            self._ready[role].append(pending.pop(nxt))
            nxt += 1
        self._next[role] = nxt
        self._maybe_look()

    def _maybe_look(self) -> None:
        if self.stopped is not None:
            return
        upto = min(self._next.values())
        judged = upto - self.warmup
        if judged < self._due or self._task is not None:
            return
        if self._due == self.planned < judged:
            # The look at the planned size decides whether to extend: it sees exactly that
            # prefix, however far the finished requests have run ahead of it.
            upto, judged = self.planned + self.warmup, self.planned
        self._due = (judged // self.look_every + 1) * self.look_every
        if judged < self.planned < self._due:
            self._due = self.planned  # a look exactly at the planned size: extend or not
        batches: dict[str, list[RequestRecord]] = {}
        for r in ROLES:
            ready = self._ready[r]
            take = upto - (self._next[r] - len(ready))
            batches[r], self._ready[r] = ready[:take], ready[take:]
        self._task = asyncio.create_task(self._look(batches, upto))

    async def _look(self, batches: Mapping[str, list[RequestRecord]], upto: int) -> None:
        try:
            look = await asyncio.to_thread(self._compute, batches)
        except BaseException:
            self._resolve(False)  # a paused schedule must never wait for a look that failed
            raise
        finally:
            self._task = None
        self.looks += 1
        self.last = look
        if look.past_plan:
            self._resolve(look.extending and not look.stop)
        if self.stopped is not None or look.at_limit or not look.stop:
            # Records that came in while this look ran may make the next one due already
            # (a paused schedule sends nothing more to trigger it).
            self._maybe_look()
            return
        if self.hold_only and not look.hold:
            return
        failed = tuple(c.id for c in look.checks if c.decision == "fail" and not c.advisory)
        reason: Literal["hold", "decided", "planned"] = (
            "hold" if look.hold else "planned" if look.past_plan else "decided"
        )
        self.stopped = EarlyStop(
            scenario=self.scenario,
            requests=min(look.samples),
            planned=look.planned,
            upto=upto,
            reason=reason,
            checks=failed if look.hold else tuple(c.id for c in look.checks),
        )
        self.on_stop(self.stopped)

    def _compute(self, batches: Mapping[str, list[RequestRecord]]) -> Look:
        arms = {}
        for role in ROLES:
            parts = self._cols[role]
            parts.append(columns_from_records(batches[role], self.zero_ns))
            whole = concat_columns(parts)
            self._cols[role] = [whole]
            arms[role] = select_requests(whole, self.warmup).to_arm()
        return self.judge.look(self.scenario, arms["reference"], arms["candidate"])

    def _resolve(self, extend: bool) -> None:
        if self.go is not None and not self.go.done():
            self.go.set_result(extend)

    async def close(self) -> None:
        """The scenario ended: a look still running decides nothing any more."""
        self._resolve(False)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
