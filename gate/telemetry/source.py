"""The sampling contract: a `Source` returns `Sample`s named in the gate's vocabulary; a
`Timeline` is what the sampler kept of one engine role's sources over one scenario.

Bounded by construction: a timeline keeps at most `max_points` scrapes (the sampler stops
recording past it, with a note), every series has one value per kept scrape (None: a gap, the
metric was absent or the scrape failed), and configuration labels are kept once (the last
seen), each value cut to `MAX_LABEL_CHARS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

MAX_LABEL_CHARS = 64
MAX_SERIES = 64
MAX_NOTES = 8


class Sample(NamedTuple):
    """One value of a metric in the gate's vocabulary (vocabulary.py), with labels that tell
    apart several series of one metric (a GPU index); a configuration fact (a KV block size, a
    cache dtype) is a sample whose `text` is set and whose value is NaN where it is no number."""

    metric: str
    value: float
    labels: Mapping[str, str] = {}
    text: str | None = None

    def key(self) -> str:
        """The series this sample belongs to: the metric, with its labels where it has any."""
        if not self.labels:
            return self.metric
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return f"{self.metric}{{{inner}}}"


class Source(Protocol):
    """Something the sampler reads each tick: an engine's metrics endpoint, a GPU. `read`
    runs on the sampler's thread; it raises on a failed read (the sampler records a gap) and
    should return within the sampler's timeout."""

    @property
    def name(self) -> str: ...

    def read(self) -> Sequence[Sample]: ...


@dataclass
class Timeline:
    """One engine role's samples over one scenario: seconds since the scenario started (the
    gate's monotonic clock) and, per series, one value per scrape (None: a gap)."""

    role: str
    sources: list[str]
    interval_s: float
    t_s: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    gaps: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    def add(self, at_s: float, samples: Sequence[Sample], failed: bool) -> None:
        """One scrape: every series gets a value (None where this scrape had none)."""
        n = len(self.t_s)
        self.t_s.append(round(at_s, 3))
        if failed:
            self.gaps += 1
        seen: dict[str, float] = {}
        for s in samples:
            if s.text is not None:
                self.config[s.metric] = s.text[:MAX_LABEL_CHARS]
                continue
            key = s.key()
            if key not in self.series:
                if len(self.series) >= MAX_SERIES:
                    self.note(f"more than {MAX_SERIES} series: {key} and later ones not kept")
                    continue
                self.series[key] = [None] * n
            seen[key] = s.value
        for key, values in self.series.items():
            v = seen.get(key)
            values.append(v if v is None or v == v else None)
