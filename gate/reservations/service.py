"""A gate's reservation as one service: reserve now, or wait for capacity when the block is
one waiting can lift; keep the lease alive while the gate runs; release it at the end; and say
what happened for the verdict document.

The GPUs come from an inventory the caller names: a file, or a cluster's nodes
(`reservations/kubernetes.py`). Leases live in the database (`leases.py`).

A lease fails safe. Its expiry is written from the database's clock at the moment of each
write, and this host only ever measures, on its own monotonic clock, how long ago a write it
started succeeded: the lease is valid for at least `ttl_s` after that start. Renewals retry
with backoff; when none has succeeded by `STOP_MARGIN` of the TTL before the lease could
expire, or the database says the lease is gone, `on_lost` is told why, and the gate stops its
engines while the GPUs are still its own. Nothing compares two hosts' clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from gate.core.errors import BlockedReservation
from gate.reservations import leases
from gate.reservations.allocator import Blocked, ShapeRequest
from gate.reservations.inventory import Inventory
from gate.verdict.document import ReservationBlocked, ReservationReleased

log = logging.getLogger("gate.reservations")

MAX_WAIT_DELAY_S = 15.0
STOP_MARGIN = 0.25  # of the TTL: the gate stops this long before its lease could expire...
TEARDOWN_S = 20.0  # ...and at least this long (up to 40% of the TTL): both engines' teardown
RENEWALS_PER_TTL = 6  # a renewal every sixth of the TTL
MAX_RETRY_DELAY_S = 2.0  # retries of a failed renewal: 1 s, 2 s, 2 s, ... until the deadline
MAX_BLOCKED_DOMAINS = 50  # a blocked reservation names this many domains in the document


def teardown_margin_s(ttl_s: float) -> float:
    """How long before a lease of `ttl_s` could expire its gate stops: room for teardown."""
    return max(ttl_s * STOP_MARGIN, min(TEARDOWN_S, ttl_s * 0.4))


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
    lost: str | None = None  # why the lease was lost while the gate held it
    ended: str | None = None  # how it had ended when the gate released it, if not by the gate
    _renewer: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _held_from: float = field(default=0.0, init=False, repr=False)  # monotonic, see docstring

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
            self._held_from = time.monotonic()  # before the write: the lease outlives this
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

    def start_keep_alive(self, on_lost: Callable[[str], None]) -> None:
        """Renew the lease every sixth of its TTL until `stop_keep_alive`; `on_lost` is told
        once, on the event loop, when the lease is lost or could expire."""
        self._renewer = asyncio.create_task(self._keep_alive(on_lost))

    async def stop_keep_alive(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def margin_s(self) -> float:
        """How long before the lease could expire the gate stops: room for its teardown."""
        return teardown_margin_s(self.ttl_s)

    def _stop_by(self, held_from: float) -> float:
        return held_from + self.ttl_s - self.margin_s()

    async def _keep_alive(self, on_lost: Callable[[str], None]) -> None:
        try:
            await self._renew_forever(on_lost)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not leave the engines on a lease nobody renews
            why = f"the lease keep-alive failed: {type(exc).__name__}: {exc}"
            self.lost = why
            log.exception("gate %s: %s; stopping the gate", self.gate_id, why)
            on_lost(why)

    async def _renew_forever(self, on_lost: Callable[[str], None]) -> None:
        period = max(1.0, self.ttl_s / RENEWALS_PER_TTL)
        stop_by = self._stop_by(self._held_from)
        while True:
            await asyncio.sleep(max(0.0, min(period, stop_by - time.monotonic())))
            renewed, why = await self._renew(stop_by, period)
            if renewed is None:
                self.lost = why
                log.error("gate %s: %s; stopping the gate", self.gate_id, why)
                on_lost(why)
                return
            stop_by = self._stop_by(renewed)

    async def _renew(self, stop_by: float, period: float) -> tuple[float | None, str]:
        """One renewal, retried with backoff until `stop_by`: the monotonic time its write
        started, or None and why it could not be renewed in time."""
        assert self.grant is not None
        rid, delay, last = self.grant.reservation_id, 1.0, ""
        while True:
            started = time.monotonic()
            if started >= stop_by:
                return None, (
                    f"the lease of reservation {rid} could not be renewed before it could "
                    f"expire (TTL {self.ttl_s:g} s; last error: {last or 'none'})"
                )
            call = asyncio.ensure_future(
                asyncio.to_thread(leases.heartbeat, self.factory, rid, self.ttl_s)
            )
            # asyncio.wait, not wait_for: on Python 3.11 wait_for loses a cancel that arrives
            # as the call completes, and the renewal would outlive its gate.
            done, _ = await asyncio.wait({call}, timeout=stop_by - started)
            if not done:
                waited = time.monotonic() - started
                return None, (
                    f"the lease of reservation {rid} could not be renewed before it could "
                    f"expire (TTL {self.ttl_s:g} s; the last renewal waited on the database for "
                    f"{waited:.1f} s, too close to its expiry"
                    + (f"; the one before it failed: {last})" if last else ")")
                )
            try:
                ok = call.result()
            except Exception as exc:  # the database is unreachable, locked, restarting
                last = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                log.warning(
                    "gate %s: renewing reservation %s failed (%s); retrying in %.0f s",
                    self.gate_id,
                    rid,
                    last,
                    delay,
                )
                await asyncio.sleep(min(delay, max(0.0, stop_by - time.monotonic() - 0.05)))
                delay = min(delay * 2, period, MAX_RETRY_DELAY_S)
                continue
            if not ok:
                return None, (
                    f"the lease of reservation {rid} was ended elsewhere while the gate held "
                    "it (reaped as expired, or released by a reaper)"
                )
            return started, ""

    async def release(self, why: str) -> int | None:
        """Release the grant, if there is one; returns its id."""
        return await asyncio.to_thread(self.release_now, why)

    def release_now(self, why: str) -> int | None:
        """`release`, synchronously (for a caller that retries it on a thread)."""
        if self.grant is None:
            return None
        rid = self.grant.reservation_id
        self.ended = leases.release(self.factory, rid, why)
        if self.ended is not None:
            log.warning(
                "gate %s: reservation %s had already ended: %s", self.gate_id, rid, self.ended
            )
        return rid

    def describe(self) -> ReservationReleased | ReservationBlocked | None:
        if self.grant is not None:
            rid = self.grant.reservation_id
            placement = leases.placement_to_json(self.grant.placement)
            if self.lost is None and self.ended is None:
                return ReservationReleased(state="released", id=rid, fence=rid, placement=placement)
            why = "; ".join(
                w for w in (self.lost, self.ended and f"it had ended: {self.ended}") if w
            )
            return ReservationReleased(
                state="lost", id=rid, fence=rid, placement=placement, lost=why
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
