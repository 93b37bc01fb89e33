"""How a running gate tells its caller what it is doing (a terminal, the API, a test)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None: ...

    def scenario_started(self, name: str, total: int) -> None: ...

    def request_done(self, name: str, done: int, total: int) -> None: ...

    def scenario_finished(self, name: str) -> None: ...


class NullProgress:
    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        return None

    def scenario_started(self, name: str, total: int) -> None:
        return None

    def request_done(self, name: str, done: int, total: int) -> None:
        return None

    def scenario_finished(self, name: str) -> None:
        return None
