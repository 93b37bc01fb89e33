"""What every stage of one gate run shares: which gate, its clock, its spec and settings, and
where its phases go (the gate's phase rows, the caller's progress, the live state the heartbeat
publishes). Stages take a `RunContext` and hand each other typed results; none of them keeps
state of the run on it except the notes every stage may add to the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gate.core.limits import Limits
from gate.core.settings import Settings
from gate.engines.lifecycle import Clock, PhaseLog
from gate.runs import rows
from gate.runs.journal import PhaseJournal, PhaseRow
from gate.runs.progress import Progress
from gate.spec import GateSpec


class LiveProgress:
    """Forwards progress to the caller's sink and keeps the latest state for the heartbeat,
    which writes it to the gate row (what the API and the live report page show)."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.state: dict[str, Any] = {}

    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        self.inner.phase(role, phase, at_s, detail)

    def scenario_started(self, name: str, total: int) -> None:
        self.state = {"scenario": name, "done": 0, "total": total}
        self.inner.scenario_started(name, total)

    def request_done(self, name: str, done: int, total: int) -> None:
        self.state = {"scenario": name, "done": done, "total": total}
        self.inner.request_done(name, done, total)

    def scenario_finished(self, name: str) -> None:
        self.state = {**self.state, "finished": True}
        self.inner.scenario_finished(name)


@dataclass
class RunContext:
    """One gate's shared context. `notes` collects what stages say for the verdict document
    (a skipped early stop, a skipped teacher-forced score)."""

    gate_id: str
    spec: GateSpec
    settings: Settings
    factory: sessionmaker[Session]
    progress: LiveProgress
    clock: Clock = field(default_factory=Clock)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.limits = Limits.from_settings(self.settings)
        self.journal = PhaseJournal(self._write_phase, self.gate_id)

    def _write_phase(self, row: PhaseRow) -> None:
        rows.record_phase(self.factory, self.gate_id, *row)

    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        """The phase sink: the caller's progress, and the gate's phase rows (written off the
        event loop, retried while the database is unreachable: journal.py)."""
        self.progress.phase(role, phase, at_s, detail)
        self.journal.record((role, phase, at_s, detail))

    def gate_phase(self, phase: str, detail: str | None = None) -> None:
        self.phase("gate", phase, self.clock.now_s(), detail)

    def phase_log(self, role: str) -> PhaseLog:
        return PhaseLog(role, self.clock, self.phase)
