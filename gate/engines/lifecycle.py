"""Lifecycle phases of an engine on the gate's monotonic clock, and crash evidence."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# In the order an engine goes through them; `stuck_in` names the first one not reached.
PROCESS_PHASES = ("launched", "process_up", "port_open", "healthy", "model_listed")
ENDPOINT_PHASES = ("attached", "port_open", "healthy", "model_listed")
GATE_PHASES = ("warmup_done", "ready")

PhaseSink = Callable[[str, str, float, str | None], None]  # role, phase, at_s, detail


@dataclass(slots=True)
class Clock:
    """Seconds since the gate started, from the monotonic clock (never the wall clock)."""

    start_ns: int = field(default_factory=time.monotonic_ns)

    def now_s(self) -> float:
        return (time.monotonic_ns() - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class CrashInfo:
    role: str
    at_s: float
    exit_code: int | None
    description: str
    log_tail: tuple[str, ...]
    group: str | None = None  # the worker group (or `router`) that crashed, for several groups

    def summary(self) -> str:
        if self.group is not None:  # the description starts with the group's name
            return f"{self.role} {self.description} at {self.at_s:.1f}s into the gate"
        return f"{self.role} engine {self.description} at {self.at_s:.1f}s into the gate"


@dataclass(slots=True)
class PhaseLog:
    role: str
    clock: Clock
    sink: PhaseSink | None = None
    reached: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, detail: str | None = None) -> float:
        at = self.clock.now_s()
        self.reached[phase] = at
        if self.sink is not None:
            self.sink(self.role, phase, at, detail)
        return at

    def stuck_in(self, order: tuple[str, ...]) -> str:
        for phase in order:
            if phase not in self.reached:
                return phase
        return order[-1]
