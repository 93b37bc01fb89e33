"""A gate's reservation as one service: reserve now, or wait for capacity when the block is
one waiting can lift; keep the lease alive while the gate runs; release it at the end; and say
what happened for the verdict document.

The GPUs come from an inventory the caller names: a file, or a cluster's nodes
(`reservations/kubernetes.py`). Leases live in the database (`leases.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from gate.core.errors import BlockedReservation
from gate.reservations import leases
from gate.reservations.allocator import Blocked, ShapeRequest
from gate.reservations.inventory import Inventory
from gate.verdict.document import ReservationBlocked, ReservationReleased

MAX_WAIT_DELAY_S = 15.0
MAX_BLOCKED_DOMAINS = 50  # a blocked reservation names this many domains in the document


@dataclass
class GateReservation:
    """One gate's GPUs. `inventory` is called in a thread (it may read a cluster); `on_wait`
    is told once when the gate starts waiting for capacity."""

    factory: sessionmaker[Session]
    inventory: Callable[[], Inventory]
    shape: ShapeRequest
    gate_id: str
    ttl_s: float
    wait_s: float = 0.0
    on_wait: Callable[[str], None] | None = None
    grant: leases.Grant | None = None
    blocked: Blocked | None = None
    _renewer: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def _reserve(self) -> leases.Grant:
        return leases.reserve(
            self.factory,
            self.inventory(),
            self.shape,
            holder=f"gate:{self.gate_id}",
            gate_id=self.gate_id,
            ttl_s=self.ttl_s,
        )

    async def reserve(self) -> leases.Grant:
        """Reserve now, or, when the block is one that waiting can lift and the shape allows
        it (`wait_s`), retry until then; the last blocked reason is raised."""
        deadline = time.monotonic() + self.wait_s
        delay = 1.0
        while True:
            attempt = asyncio.ensure_future(asyncio.to_thread(self._reserve))
            try:
                self.grant = await asyncio.shield(attempt)
                return self.grant
            except asyncio.CancelledError:
                # Stopped (a cancel, the deadline) while the thread reserves: a grant it still
                # gets is ours to release.
                with contextlib.suppress(Exception):
                    self.grant = await attempt
                raise
            except BlockedReservation as exc:
                self.blocked = exc.blocked
                if not exc.blocked.retryable or time.monotonic() + delay > deadline:
                    raise
                if self.on_wait is not None and delay == 1.0:
                    self.on_wait(f"{exc.blocked.code}: {exc.message}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_WAIT_DELAY_S)

    def start_keep_alive(self) -> None:
        """Renew the lease every third of its TTL until `stop_keep_alive`."""
        self._renewer = asyncio.create_task(self._keep_alive())

    async def stop_keep_alive(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _keep_alive(self) -> None:
        assert self.grant is not None
        period = max(1.0, self.ttl_s / 3)
        while True:
            await asyncio.sleep(period)
            await asyncio.to_thread(
                leases.heartbeat, self.factory, self.grant.reservation_id, self.ttl_s
            )

    async def release(self, why: str) -> int | None:
        """Release the grant, if there is one; returns its id."""
        if self.grant is None:
            return None
        await asyncio.to_thread(leases.release, self.factory, self.grant.reservation_id, why)
        return self.grant.reservation_id

    def describe(self) -> ReservationReleased | ReservationBlocked | None:
        if self.grant is not None:
            return ReservationReleased(
                state="released",
                id=self.grant.reservation_id,
                fence=self.grant.reservation_id,
                placement=leases.placement_to_json(self.grant.placement),
            )
        if self.blocked is None:
            return None
        b = self.blocked
        return ReservationBlocked(
            state="blocked",
            code=b.code,
            message=b.message,
            retryable=b.retryable,
            eliminated=b.eliminated,
            per_domain=[f._asdict() for f in b.per_domain[:MAX_BLOCKED_DOMAINS]],
        )
