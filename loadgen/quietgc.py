"""Keep the cyclic garbage collector's pauses out of the measurements.

CPython's oldest-generation collection walks every tracked object the process holds. In a long
test session or a service with a large heap that walk takes hundreds of milliseconds, and a
load generator paused for that long sends late and stamps late: one such pause between the two
sends of a mirrored request put 456 ms between them. ``gc.freeze()`` moves every object alive
now into a permanent generation the collector skips, so a collection during the run walks only
what the run itself allocated; refreezing every ``refreeze_every`` finished requests keeps the
accumulated records out of that walk too. Garbage frozen on the way (a few in-flight objects
per refreeze) is collected after ``unfreeze`` at the end. Long-running Python servers freeze
their start-up heap for the same reason (the sim does).

Nesting and threads are safe: the permanent generation is returned to the collector only when
the last run in the process ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_active = 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the duration of a timed run."""
    global _active
    with _lock:
        _active += 1
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                gc.unfreeze()


def refreeze() -> None:
    """Move what survived so far out of the collector's way (only inside ``frozen_heap``)."""
    if _active:
        gc.freeze()


def active_runs() -> int:
    return _active
