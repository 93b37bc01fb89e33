"""Inputs and outputs of the judge: plain frozen dataclasses, no I/O.

The arrays are copied into read-only float64 arrays on construction so that a verdict can never
be changed after the fact by someone mutating the buffers the gate handed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

__all__ = [
    "ArmSamples",
    "Check",
    "CheckGroup",
    "Decision",
    "EngineFacts",
    "ScenarioSamples",
    "Verdict",
]

Decision = Literal["pass", "fail", "inconclusive"]
CheckGroup = Literal["latency", "errors", "startup", "crash"]


def _frozen_array(name: str, values: object) -> np.ndarray:
    arr = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class ArmSamples:
    """What one engine produced in one scenario, after the warm-up was discarded.

    ttft_ms: one value per successful request.
    itl_ms: one value per successful request with at least two tokens: that request's mean
        inter-token gap. Pooling every token gap instead would make the samples dependent
        (the gaps of one request share its batch and its fate) and weight long requests more;
        the quantile confidence sequences assume i.i.d. samples, and per-request means are.
    errors: failed requests counted by kind (e.g. "http_5xx", "timeout").
    error_offsets_s: the time of each error from the scenario start, so that the sequential
        count test sees the errors of both arms in the order they happened.
    """

    requests: int
    ttft_ms: np.ndarray
    itl_ms: np.ndarray
    errors: Mapping[str, int] = field(default_factory=dict)
    error_offsets_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.requests < 0:
            raise ValueError(f"requests must be >= 0, got {self.requests}")
        for kind, n in self.errors.items():
            if n < 0:
                raise ValueError(f"error count for {kind!r} must be >= 0, got {n}")
        object.__setattr__(self, "ttft_ms", _frozen_array("ttft_ms", self.ttft_ms))
        object.__setattr__(self, "itl_ms", _frozen_array("itl_ms", self.itl_ms))
        object.__setattr__(
            self, "error_offsets_s", _frozen_array("error_offsets_s", self.error_offsets_s)
        )
        object.__setattr__(self, "errors", MappingProxyType(dict(self.errors)))

    @property
    def error_count(self) -> int:
        return int(sum(self.errors.values()))

    def metric(self, name: str) -> np.ndarray:
        """Samples of a latency metric by its policy name ("ttft" or "itl")."""
        if name == "ttft":
            return self.ttft_ms
        if name == "itl":
            return self.itl_ms
        raise KeyError(name)


@dataclass(frozen=True, eq=False)
class ScenarioSamples:
    """Both arms of one scenario, driven by the same mirrored request stream."""

    name: str
    reference: ArmSamples
    candidate: ArmSamples


@dataclass(frozen=True)
class EngineFacts:
    """What the gate knows about an engine process.

    ready_s: seconds from launch to ready; None when the endpoint was attached rather than
        launched by the gate, so there is no startup time to compare.
    """

    role: Literal["reference", "candidate"]
    ready_s: float | None
    crashed: bool = False
    crash_detail: str | None = None


def _json_float(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Check:
    """One judged comparison with the statistics behind it.

    interval: for latency, the anytime-valid interval of the candidate/reference quantile
        ratio; reference/candidate/ratio: Harrell-Davis point estimates (latency) or error
        fractions (errors) or ready seconds (startup); alpha: the share of the family-wise
        budget this check spent (None for deterministic rules); samples: (reference, candidate).
    """

    id: str
    group: CheckGroup
    scenario: str | None
    metric: str
    quantile: float | None
    reference: float | None
    candidate: float | None
    ratio: float | None
    interval: tuple[float, float] | None
    threshold: float | None
    decision: Decision
    samples: tuple[int, int]
    alpha: float | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: NaN and infinities become None (an unbounded interval end reads as null)."""
        return {
            "id": self.id,
            "group": self.group,
            "scenario": self.scenario,
            "metric": self.metric,
            "quantile": _json_float(self.quantile),
            "reference": _json_float(self.reference),
            "candidate": _json_float(self.candidate),
            "ratio": _json_float(self.ratio),
            "interval": (
                None
                if self.interval is None
                else [_json_float(self.interval[0]), _json_float(self.interval[1])]
            ),
            "threshold": _json_float(self.threshold),
            "decision": self.decision,
            "samples": [int(self.samples[0]), int(self.samples[1])],
            "alpha": _json_float(self.alpha),
            "message": self.message,
        }


@dataclass(frozen=True)
class Verdict:
    """continue only when every evaluated check passed; reasons are the checks that did not."""

    decision: Literal["continue", "hold"]
    checks: tuple[Check, ...]
    reasons: tuple[Check, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "checks": [c.to_dict() for c in self.checks],
            "reasons": [c.to_dict() for c in self.reasons],
            "notes": list(self.notes),
        }
