"""Wake-ups at an exact instant on the monotonic clock.

asyncio's timers cannot fire a request on time: its epoll waits are whole milliseconds, rounded
up, so a timer is 0-1 ms late before the loop even runs it, and then it waits behind whatever
the loop is doing in that pass. A load generator that sleeps until a request's instant and then
builds and sends it adds both to every dispatch delay.

:class:`PreciseTimer` arms a Linux ``timerfd`` (``CLOCK_MONOTONIC``, absolute time) and
registers it with the event loop as a reader: the kernel wakes the loop's ``epoll_wait`` when
the instant comes, to the microsecond, and the callback runs in that very pass. The load
generator builds each request a few milliseconds ahead, and only the socket write waits for the
timer (see ``loadgen.transport``), so a request leaves within tens of microseconds of its
instant unless the loop is inside a long callback at that moment. Elsewhere the timer falls back
to ``loop.call_at`` with asyncio's resolution.

``CLOCK_MONOTONIC`` is the clock of ``time.monotonic_ns()`` on Linux, the clock of every stamp
the load generator takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_create.restype = ctypes.c_int
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
        libc.timerfd_settime.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


class PreciseTimer:
    """Callbacks at absolute ``time.monotonic_ns()`` instants, run on the given loop.

    Callbacks due at the same instant run in the order they were added, in one pass. ``close``
    drops whatever is still pending.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._armed_ns = 0  # instant the timerfd is set for; 0: disarmed
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._spec = _Itimerspec()
        if _libc is not None:
            fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                try:
                    loop.add_reader(fd, self._fired)
                except (NotImplementedError, RuntimeError):
                    os.close(fd)  # a loop without add_reader (Windows proactor)
                else:
                    self._fd = fd

    @property
    def precise(self) -> bool:
        """Whether wake-ups come from the kernel timer rather than asyncio's."""
        return self._fd >= 0

    def call_at_ns(self, at_ns: int, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (at_ns, next(self._seq), callback))
        if self._heap[0][0] == at_ns:
            self._arm(at_ns)

    def close(self) -> None:
        self._heap.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _arm(self, at_ns: int) -> None:
        if self._armed_ns == at_ns:
            return
        self._armed_ns = at_ns
        if self._fd >= 0:
            spec = self._spec
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(at_ns, 1_000_000_000)
            if (
                _libc is not None
                and _libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)
                == 0
            ):
                return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(at_ns / 1e9, self._fired)

    def _fired(self) -> None:
        if self._fd >= 0:
            # BlockingIOError: re-armed for a later instant after this wake-up was queued.
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 8)
        self._armed_ns = 0
        self._handle = None
        heap = self._heap
        now = time.monotonic_ns()
        while heap and heap[0][0] <= now:
            _, _, callback = heapq.heappop(heap)
            try:
                callback()
            except Exception as exc:  # one failing callback must not strand the others
                self._loop.call_exception_handler(
                    {"message": "PreciseTimer callback failed", "exception": exc}
                )
        if heap:
            self._arm(heap[0][0])
