"""`gate serve`'s HTTP server: uvicorn, with deadlines on slow clients and caps on connections.

What uvicorn 0.55 offers (read in its `config.py` and `protocols/http/h11_impl.py`) and what
it leaves open:

- `timeout_keep_alive` closes an idle connection only *after* a response: a connection that
  never completes its first request head, or trickles one byte of it every 2 s, is held
  forever. Measured: 300 such connections were all held after 25 s; with the open-file limit
  at 256, honest requests timed out.
- Nothing bounds how long a request's body may take: 300 connections sending `Content-Length:
  100000` and a byte every 2 s were all held too.
- `limit_concurrency` answers 503 once a request's head has arrived while that many
  connections are open: trickling connections count against it and are never cut, so it
  turns them into 503s for everybody. `h11_max_incomplete_event_size` (16 KiB by default)
  bounds a head's size, not its time; `backlog` only the kernel's accept queue.

So the protocol below (uvicorn's own h11 protocol, subclassed) adds:

- a head deadline (`GATE_HEADER_TIMEOUT_S`): a request's line and headers must arrive within
  it, counted from the connection's opening or the next request's first byte; past it the
  client gets 408 and the connection is closed;
- a body deadline (`GATE_BODY_TIMEOUT_S`): the whole body within it after the head; time
  the server itself stopped reading (flow control, the app not reading yet) is not the
  client's: the deadline waits while reading is paused;
- a cap on open connections (`GATE_MAX_CONNECTIONS`, at most half the process's open-file
  limit, the rest for the database, engines and logs) and one per client address
  (`GATE_MAX_CONNECTIONS_PER_CLIENT`): a connection past either gets 503 and is closed at
  once, so its file descriptor is not held.

Behind a reverse proxy every connection comes from the proxy's address: the per-client cap is
then the proxy's (docs/security.md, "Slow and many clients").
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from gate.core.settings import Settings

log = logging.getLogger("gate.http")

FD_SHARE = 2  # connections may take at most 1/FD_SHARE of the open-file limit
REFUSED_LINGER_S = 2.0  # a refused connection reads (and drops) its request this long at most


@dataclass(frozen=True)
class ServerLimits:
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_connections: int
    max_connections_per_client: int  # 0: no per-client cap

    @classmethod
    def from_settings(cls, settings: Settings, open_files: int | None = None) -> ServerLimits:
        """The settings' limits, the connection cap lowered to fit the open-file limit."""
        if open_files is None:
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        cap = settings.max_connections
        if open_files != resource.RLIM_INFINITY and open_files > 0:
            fits = max(1, open_files // FD_SHARE)
            if fits < cap:
                log.warning(
                    "GATE_MAX_CONNECTIONS %d lowered to %d: the open-file limit is %d "
                    "(raise it with `ulimit -n` to allow more)",
                    cap,
                    fits,
                    open_files,
                )
                cap = fits
        return cls(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            keep_alive_s=settings.keep_alive_s,
            max_connections=cap,
            max_connections_per_client=settings.max_connections_per_client,
        )


def _answer(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer in the app's error shape, written before or instead of the
    app's (the request was never handed to it, or is abandoned): the connection closes."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _TimedFlow(FlowControl):
    """uvicorn's flow control, adding up how long reading was paused (the body deadline
    gives that time back)."""

    def __init__(self, transport: asyncio.Transport, owner: GuardedH11Protocol) -> None:
        super().__init__(transport)
        self._owner = owner
        self._since: float | None = None

    def pause_reading(self) -> None:
        if not self.read_paused:
            self._since = self._owner.loop.time()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self._since is not None:
            self._owner._paused_s += self._owner.loop.time() - self._since
            self._since = None
        super().resume_reading()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and caps of the module docstring. `limits`
    and the per-client counts are class attributes: `protocol_class` makes one subclass per
    server, and a server's connections all live on its one event loop (no locks needed)."""

    limits: ClassVar[ServerLimits]
    per_client: ClassVar[Counter[str]]
    refused: ClassVar[Counter[str]]  # why connections were refused or cut: for the logs, tests

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head" or "body": what the deadline is for
        self._counted: str | None = None  # the client address counted for this connection
        self._refused = False  # answered 503: what the client still sends is discarded

    # -- the connection caps -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._paused_s = 0.0  # reading paused this long while the body deadline ran
        self.flow = _TimedFlow(transport, self)
        peer = self.client[0] if self.client else "unknown"
        per_client = self.limits.max_connections_per_client
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                "max_connections",
                f"the server has {self.limits.max_connections} connections open "
                "(GATE_MAX_CONNECTIONS); try again shortly",
            )
            return
        if per_client and self.per_client[peer] >= per_client:
            self._refuse(
                "max_connections_per_client",
                f"this address has {per_client} connections open "
                "(GATE_MAX_CONNECTIONS_PER_CLIENT); close one or try again shortly",
            )
            return
        self.per_client[peer] += 1
        self._counted = peer
        self._arm("head")

    def _refuse(self, why: str, message: str) -> None:
        self.refused[why] += 1
        log.debug("connection from %s refused: %s", self.client, why)
        self._refused = True
        self.transport.write(_answer(503, "Service Unavailable", "too_many_connections", message))
        # close() with the client's request unread in the socket sends RST, and the client
        # reads "connection reset" instead of the 503: half-close, discard what comes, close
        # on the client's EOF or after REFUSED_LINGER_S at most.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._deadline = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self.per_client[self._counted] -= 1
            if self.per_client[self._counted] <= 0:
                del self.per_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    # -- the deadlines ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._follow()

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()
        super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Arm the deadline for what the client owes now: a head (a request begun and not
        yet parsed), a body (a head parsed, its body not all here), or nothing. Between
        requests nothing is owed until the next one's first byte (`timeout_keep_alive`
        covers the idle wait)."""
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body")
        elif state is h11.IDLE and (self.cycle is None or self.conn.trailing_data[0]):
            self._arm("head")  # the first request, or bytes of the next one
        else:
            self._disarm()
            if state is h11.IDLE and self.timeout_keep_alive_task is None:
                # Idle after an answer whose unread body the client has just finished
                # sending: uvicorn's data_received dropped the keep-alive timer; re-arm it.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

    def _arm(self, what: str) -> None:
        if self._waiting_for == what:
            return  # counted from when it was first owed, not from the latest byte
        self._disarm()
        self._paused_s = 0.0
        timeout = self.limits.header_timeout_s if what == "head" else self.limits.body_timeout_s
        self._waiting_for = what
        self._deadline = self.loop.call_later(timeout, self._expired, what, timeout)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting_for = None

    def _expired(self, what: str, timeout: float) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._waiting_for != what:
            return
        if what == "body" and (self.flow.read_paused or self._paused_s > 0):
            # Time the server did not read is not the client's: give it back.
            owed = self._paused_s if not self.flow.read_paused else timeout
            self._paused_s = 0.0
            self._deadline = self.loop.call_later(owed, self._expired, what, timeout)
            return
        if self.cycle is not None and self.cycle.response_complete:
            # Answered already (e.g. 413 before the body): no second answer, just close.
            self.transport.close()
            return
        self._waiting_for = None
        setting = "GATE_HEADER_TIMEOUT_S" if what == "head" else "GATE_BODY_TIMEOUT_S"
        self.refused[f"{what}_timeout"] += 1
        log.debug(
            "connection from %s cut: its request %s took over %g s", self.client, what, timeout
        )
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app is waiting for the body: it reads a disconnect, and what it writes
            # from now on goes nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        self.transport.write(
            _answer(
                408,
                "Request Timeout",
                "request_timeout",
                f"the request's {what} did not arrive within {timeout:g} s ({setting})",
            )
        )
        self.transport.close()


def protocol_class(limits: ServerLimits) -> type[GuardedH11Protocol]:
    """A protocol class of its own for one server: its limits and its per-client counts."""
    return type(
        "GateH11Protocol",
        (GuardedH11Protocol,),
        {"limits": limits, "per_client": Counter(), "refused": Counter()},
    )


def server_config(app: Any, settings: Settings, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration `gate serve` runs: our protocol (h11, whatever else is
    installed), its keep-alive, no uvicorn logging config (ours: gate.worker.logs)."""
    limits = ServerLimits.from_settings(settings)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(limits),
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        log_level="info",
        log_config=None,
    )
