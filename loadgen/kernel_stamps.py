"""Kernel receive stamps for the load generator's sockets: when bytes reached the host.

A client that stamps a read with ``time.monotonic_ns()`` when its event loop gets round to it
adds its own lateness to every TTFT and inter-token gap it measures. With ``SO_TIMESTAMPNS``
the kernel stamps each segment as it arrives, and :class:`StampedSocket` hands the stamp of
the latest read to the connection that parses it (``loadgen.connections``). Where the
platform has no such option, :data:`SO_TIMESTAMPNS` is None and the transport opens plain
sockets (the stamp is then taken before any parsing). The stamps cost about 0.3 ms of client
CPU per 64-token request (``recvmsg_into`` instead of ``recv_into``; docs/performance.md).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from typing import Any

SO_TIMESTAMPNS: int | None = getattr(
    socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None
)
_TIMESPEC = struct.Struct("qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)
_SOL_SOCKET = socket.SOL_SOCKET
_unpack_timespec = _TIMESPEC.unpack_from
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns


class StampedSocket(socket.socket):
    """A client socket that keeps the kernel's receive time of the data it last returned.

    With ``SO_TIMESTAMPNS`` the kernel stamps each segment as it arrives; ``recvmsg_into``
    returns the stamp of the latest one read (TCP keeps the later stamp when it coalesces
    segments). Reads therefore carry the moment their bytes reached the host, whatever the
    event loop was busy with at the time: a busy client no longer adds its own lateness to
    TTFT and inter-token gaps. The stamp is on the realtime clock and is moved to the
    monotonic clock by the offset between the two, read together at each receive. asyncio's
    selector transport reads a buffered protocol's data with ``recv_into``, so that is the
    method replaced.
    """

    __slots__ = ("rx_ns",)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        # On the path of every read: no per-call lookups beyond what the stamp needs.
        if nbytes:
            buffer = memoryview(buffer)[:nbytes]
        received, ancdata, _, _ = self.recvmsg_into((buffer,), _ANC_SIZE, flags)
        if ancdata:
            level, kind, payload = ancdata[0]  # the one control message this socket asks for
            if kind == SO_TIMESTAMPNS and level == _SOL_SOCKET:
                sec, nsec = _unpack_timespec(payload)
                # The clock offset at the midpoint of two monotonic reads around the realtime
                # one; read again if a preemption stretched that bracket (a busy machine).
                m1 = _monotonic_ns()
                real = _time_ns()
                m2 = _monotonic_ns()
                if m2 - m1 > 20_000:
                    m1 = _monotonic_ns()
                    real = _time_ns()
                    m2 = _monotonic_ns()
                self.rx_ns = sec * 1_000_000_000 + nsec + (m1 + m2) // 2 - real
                return received
        self.rx_ns = 0  # not stamped (timestamping switching on): never an earlier read's
        return received


async def connect_stamped(loop: asyncio.AbstractEventLoop, host: str, port: int) -> StampedSocket:
    """Resolve and connect like ``create_connection`` does, on a stamping socket."""
    assert SO_TIMESTAMPNS is not None
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = StampedSocket(family, kind, proto)
        sock.rx_ns = 0
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error or OSError(f"cannot resolve {host}")
