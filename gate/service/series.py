"""The per-check series `/metrics` serves, read from the database at scrape time and bounded.

Labels a scrape can grow without end are bounded here, once:
- `spec`: a spec's name, sanitised (letters, digits, `_.-`, at most `MAX_LABEL_CHARS`), the
  `MAX_SPEC_LABELS` specs with the most finished gates by name; every other spec is `other`.
- `check`: a check's id without its scenario (`steady.ttft.p50` -> `ttft.p50`): the judge's
  own vocabulary (latency quantiles, window, creep, tail, errors, startup phases, crash,
  capabilities, probes, correctness), never a spec's words; an id outside that shape, or past
  `MAX_CHECK_LABELS` distinct ones, is `other`.
- `verdict`, `decision`, `aa`, `state`: closed sets.

Ratios and decisions are over the last `window` finished gates (a gauge histogram: a gate
leaving the window lowers its counts); finished gates by spec, verdict and A/A are counted
over all time (a counter).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import db_now, reading
from gate.service import repository

MAX_SPEC_LABELS = 20
MAX_CHECK_LABELS = 100
MAX_LABEL_CHARS = 64
METRICS_WINDOW = 500  # finished gates the ratio, decision and duration series read
OTHER = "other"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
CHECK_SHAPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+){0,3}$")


def sanitise(name: str) -> str:
    return _UNSAFE.sub("_", name)[:MAX_LABEL_CHARS] or OTHER


def check_kind(check_id: str, scenario: str | None) -> str:
    """A check's id without its scenario, if it has the judge's shape; else `other`."""
    kind = check_id.removeprefix(f"{scenario}.") if scenario else check_id
    return kind if len(kind) <= MAX_LABEL_CHARS and CHECK_SHAPE.match(kind) else OTHER


@dataclass
class Labels:
    """The bounded label sets of one scrape (module docstring)."""

    specs: set[str]
    checks: set[str] = field(default_factory=set)

    def spec(self, name: str) -> str:
        label = sanitise(name)
        return label if label in self.specs else OTHER

    def check(self, check_id: str, scenario: str | None) -> str:
        kind = check_kind(check_id, scenario)
        if kind not in self.checks:
            if len(self.checks) >= MAX_CHECK_LABELS:
                return OTHER
            self.checks.add(kind)
        return kind


def top_specs(finished: Iterable[tuple[str, str, bool, int]]) -> set[str]:
    by_spec: Counter[str] = Counter()
    for name, _, _, n in finished:
        by_spec[sanitise(name)] += n
    return {name for name, _ in by_spec.most_common(MAX_SPEC_LABELS)}


@dataclass(frozen=True)
class CheckPointRow:
    spec: str
    check: str
    verdict: str
    ratio: float | None
    decision: str


@dataclass(frozen=True)
class GateSeries:
    """What the per-check and per-gate series of one scrape are made of, labels bounded."""

    finished: dict[tuple[str, str, str], int]  # (spec, verdict, aa) -> gates, all time
    checks: list[CheckPointRow]  # the last window's checks
    durations: list[tuple[str, str, float]]  # (spec, verdict, seconds) of the last window
    oldest_active_s: dict[str, float]  # state -> seconds since the oldest such gate began


def gate_series(factory: sessionmaker[Session], window: int = METRICS_WINDOW) -> GateSeries:
    with reading(factory) as s:
        finished = repository.finished_by_spec(s)
        recent = repository.recent_finished(s, window)
        checks = repository.checks_of(s, [r[0] for r in recent])
        oldest = repository.oldest_active(s)
        at = db_now(s)
    labels = Labels(top_specs(finished))
    counts: Counter[tuple[str, str, str]] = Counter()
    for name, verdict, aa, n in finished:
        counts[(labels.spec(name), verdict, "true" if aa else "false")] += n
    gate_of = {gid: (labels.spec(name), verdict or "") for gid, name, verdict, _, _ in recent}
    rows = [
        CheckPointRow(gate_of[gid][0], labels.check(cid, sc), gate_of[gid][1], ratio, decision)
        for gid, cid, sc, ratio, decision in checks
    ]
    durations = [
        (labels.spec(name), verdict or "", (fin - st).total_seconds())
        for _, name, verdict, st, fin in recent
        if st is not None and fin is not None
    ]
    return GateSeries(dict(counts), rows, durations, _ages(oldest, at))


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _ages(oldest: list[tuple[str, datetime | None]], at: datetime) -> dict[str, float]:
    return {
        state: max(0.0, (_aware(at) - _aware(t)).total_seconds()) if t is not None else 0.0
        for state, t in oldest
    }
