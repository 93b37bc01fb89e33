"""Inputs and outputs of the judge: plain frozen dataclasses, no I/O.

The arrays are copied into read-only float64 arrays on construction so that a verdict can never
be changed after the fact by someone mutating the buffers the gate handed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from gate.core.errors import InvalidSamples
from gate.core.vocabulary import CheckDecision as Decision
from gate.core.vocabulary import CheckGroup, GateDecision, Role

__all__ = [
    "ArmSamples",
    "Check",
    "CheckGroup",
    "Decision",
    "EngineFacts",
    "ScenarioSamples",
    "Verdict",
]


def _frozen_array(name: str, values: object) -> np.ndarray:
    arr = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        first = int(bad[0])
        raise InvalidSamples(
            f"{name}[{first}] is {float(arr[first])}: samples must be finite numbers "
            f"({bad.size} of {arr.size} values are NaN or infinite)"
        )
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class ArmSamples:
    """What one engine produced in one scenario, after the warm-up was discarded.

    ttft_ms: one value per successful request.
    itl_ms: one value per successful request with at least two tokens: that request's mean
        inter-token gap. Pooling every token gap instead would make the samples dependent
        (the gaps of one request share its batch and its fate) and weight long requests more.
        Per-request means are not independent either (requests share batches): the paired
        checks average them over blocks of the schedule for that (paired.py).
    errors: failed requests counted by kind (e.g. "http_5xx", "timeout").
    error_offsets_s: the time of each error from the scenario start, so that the sequential
        count test sees the errors of both arms in the order they happened.
    e2e_ms: one value per successful request, send to last token (optional: empty when the
        gate does not judge end-to-end latency).
    error_kinds: the kind of each error in `error_offsets_s`, same order (optional). With it the
        per-kind count tests see the order of each kind's errors; without it they fall back to
        the final counts.
    offsets_s: per metric name, the send offset (seconds from the scenario start) of each sample
        of that metric, same order (optional; the reports' charts read it).
    error_ids: the schedule id (request id) of each error in `error_offsets_s`, same order
        (optional). With it, and the arm's requests being the contiguous ids from its first
        one, the error ceiling is tested on the failed fraction of each block of 32 requests
        (burst-robust); without it, on the error count (independent errors assumed).
    first_id: the schedule id of the arm's first request (with `error_ids`).
    ids: per metric name, the schedule id (request id) of each sample of that metric, same
        order (optional). The paired checks join the two engines' samples by it, so an error
        on one side drops that request's pair only; without it they pair by position.
    nan_logprobs, empty_outputs: responses with a NaN or infinite logprob, and successful
        responses without a single token. Either is a broken engine, not a statistic.

    Every array is in send order: the sequential judge reads prefixes of it and the paired
    checks cut it into blocks of consecutive requests.
    """

    requests: int
    ttft_ms: np.ndarray
    itl_ms: np.ndarray
    errors: Mapping[str, int] = field(default_factory=dict)
    error_offsets_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    e2e_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    error_kinds: tuple[str, ...] = ()
    offsets_s: Mapping[str, np.ndarray] = field(default_factory=dict)
    ids: Mapping[str, np.ndarray] = field(default_factory=dict)
    error_ids: np.ndarray | None = None
    first_id: int = 0
    nan_logprobs: int = 0
    empty_outputs: int = 0

    def __post_init__(self) -> None:
        if self.requests < 0:
            raise ValueError(f"requests must be >= 0, got {self.requests}")
        for kind, n in self.errors.items():
            if n < 0:
                raise ValueError(f"error count for {kind!r} must be >= 0, got {n}")
        if self.nan_logprobs < 0 or self.empty_outputs < 0:
            raise ValueError("nan_logprobs and empty_outputs must be >= 0")
        for name in ("ttft_ms", "itl_ms", "e2e_ms", "error_offsets_s"):
            object.__setattr__(self, name, _frozen_array(name, getattr(self, name)))
        object.__setattr__(self, "errors", MappingProxyType(dict(self.errors)))
        object.__setattr__(self, "error_kinds", tuple(str(k) for k in self.error_kinds))
        offsets = {}
        for metric, values in self.offsets_s.items():
            arr = _frozen_array(f"offsets_s[{metric!r}]", values)
            if arr.size != self.metric(metric).size:
                raise ValueError(
                    f"offsets_s[{metric!r}] has {arr.size} values for "
                    f"{self.metric(metric).size} samples"
                )
            offsets[metric] = arr
        object.__setattr__(self, "offsets_s", MappingProxyType(offsets))
        ids = {}
        for metric, values in self.ids.items():
            arr = np.array(values, dtype=np.int64, copy=True).reshape(-1)
            if arr.size != self.metric(metric).size:
                raise ValueError(
                    f"ids[{metric!r}] has {arr.size} values for {self.metric(metric).size} samples"
                )
            arr.setflags(write=False)
            ids[metric] = arr
        object.__setattr__(self, "ids", MappingProxyType(ids))
        if self.error_ids is not None:
            err_ids = np.array(self.error_ids, dtype=np.int64, copy=True).reshape(-1)
            if err_ids.size != self.error_count:
                raise ValueError(f"error_ids has {err_ids.size} ids for {self.error_count} errors")
            if err_ids.size and (
                err_ids.min() < self.first_id or err_ids.max() >= self.first_id + self.requests
            ):
                raise ValueError(
                    f"error_ids must lie in [{self.first_id}, {self.first_id + self.requests})"
                )
            err_ids.setflags(write=False)
            object.__setattr__(self, "error_ids", err_ids)

    @property
    def error_count(self) -> int:
        return int(sum(self.errors.values()))

    def metric(self, name: str) -> np.ndarray:
        """Samples of a latency metric by its policy name ("ttft", "itl" or "e2e")."""
        if name == "ttft":
            return self.ttft_ms
        if name == "itl":
            return self.itl_ms
        if name == "e2e":
            return self.e2e_ms
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
    restarts: times the engine process restarted (or its server re-initialised) during the
        gate; oom: an out-of-memory was seen (exit status, log line or CUDA error). Both hold
        like a crash: an engine that survives only by restarting is not healthy.
    phases: duration in seconds of each startup phase ("weights_loaded", "cuda_graphs", ...),
        one float for a single launch or a sequence with one value per launch when the gate
        launched each engine several times (then the phases are compared with a test).
    launch_host_busy: the share of the gate host's CPUs that work other than the gate's
        engines kept busy during this engine's launch, its start (0 to 1); None when not
        measured (not a process on the gate's host, or no counters). Startup rules read it
        (engines.py).
    launch_cpu_wait_s: the longest any one thread of the engine waited for a CPU over the same
        span, seconds; None when not measured. It bounds what contention can explain.
    """

    role: Role
    ready_s: float | None
    crashed: bool = False
    crash_detail: str | None = None
    restarts: int = 0
    oom: bool = False
    phases: Mapping[str, float | Sequence[float]] = field(default_factory=dict)
    launch_host_busy: float | None = None
    launch_cpu_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {self.restarts}")
        busy = self.launch_host_busy
        if busy is not None and not (math.isfinite(busy) and 0.0 <= busy <= 1.0):
            raise ValueError(f"launch_host_busy must be a share in [0, 1], got {busy!r}")
        wait = self.launch_cpu_wait_s
        if wait is not None and not (math.isfinite(wait) and wait >= 0.0):
            raise ValueError(f"launch_cpu_wait_s must be seconds >= 0, got {wait!r}")
        clean: dict[str, float | tuple[float, ...]] = {}
        for name, value in self.phases.items():
            if isinstance(value, int | float):
                values: tuple[float, ...] = (float(value),)
                clean[name] = float(value)
            else:
                values = tuple(float(v) for v in value)
                clean[name] = values
            if not values or not all(math.isfinite(v) and v >= 0.0 for v in values):
                raise ValueError(f"phase {name!r} needs finite durations >= 0, got {value!r}")
        object.__setattr__(self, "phases", MappingProxyType(clean))

    def phase_durations(self) -> dict[str, tuple[float, ...]]:
        """Every phase as a tuple of durations, one per launch."""
        out: dict[str, tuple[float, ...]] = {}
        for name, value in self.phases.items():
            out[name] = (float(value),) if isinstance(value, int | float) else tuple(value)
        return out


def _json_float(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Check:
    """One judged comparison with the statistics behind it.

    interval: the anytime-valid interval that decided: for latency, of the paired
        candidate/reference ratio of a quantile or of the tail (paired.py); for goodput (peak) and
        collapse (overload), of the candidate-minus-reference difference of fractions.
        reference/candidate: Harrell-Davis estimates of each engine's quantile (a tail check:
        the mean of each engine's slowest 5%), ratio: the paired estimate that was tested
        (the mean block log ratio, exponentiated; latency), error fractions
        (errors), goodput or collapse fractions (peak,
        overload), seconds (startup, recovery), per-prompt medians or counts (correctness),
        HTTP statuses (compatibility). threshold: what the interval or value is compared
        with. alpha: the share of the family-wise budget this check spent (None for
        deterministic rules); samples: (reference, candidate) observations used.
    estimate_interval: a 95% interval around the reported ratio, for people: it is narrower
        than `interval` because it holds at one sample size only, and it never decides
        anything.
    required: whether an undecided (inconclusive) check holds the gate. True for everything
        but the latency and tail checks, which hold on evidence only unless the policy lists
        them in `require`: one they leave undecided is reported with `detectable`.
    detectable: for a paired latency or tail check, the smallest regression (a ratio, e.g.
        1.11 for +11%) this gate could have detected with 80% power at its size.
    correlation_requests: how far the check's block statistics correlate, in requests (the
        AR(1) correlation time of the blocks times their size; one block's worth when
        neighbouring blocks are independent); block_requests: the block length the
        paired test averaged over, fixed by the plan.
    warning: why this check is in the warning tier, or None: it does not hold the gate, but a
        continue must say it (a check past its warning threshold, an error rate above the
        ceiling without confidence, a test bed that looks unhealthy). A continue with
        warnings reads "continue, with N warnings" on every surface; exit codes and rollout
        answers stay binary.
    advisory: the policy's `advisory` names it: judged as any other, it never holds
        (`holds`); one that would have (`advisory_failed`) is listed apart.
    """

    @property
    def not_shown(self) -> bool:
        """An undecided check that does not hold: what a continue could not show (a test bed's
        warning, `gate.environment`, is no claim about the candidate: it is a warning only)."""
        return (
            self.decision == "undecided"
            and not self.required
            and not self.advisory
            and self.metric != "environment"
        )

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
    estimate_interval: tuple[float, float] | None = None
    required: bool = True
    detectable: float | None = None
    correlation_requests: float | None = None
    block_requests: int | None = None
    warning: str | None = None
    advisory: bool = False

    @property
    def would_hold(self) -> bool:
        """A failed check, or an undecided required one: what holds unless it is advisory."""
        return self.decision == "fail" or (self.decision == "undecided" and self.required)

    @property
    def holds(self) -> bool:
        """A failed check holds the gate; an undecided one only when it is required; an
        advisory one never (policy.advisory)."""
        return self.would_hold and not self.advisory

    @property
    def advisory_failed(self) -> bool:
        """An advisory check that would have held: listed apart, holding nothing."""
        return self.would_hold and self.advisory

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
            "estimate_interval": (
                None
                if self.estimate_interval is None
                else [
                    _json_float(self.estimate_interval[0]),
                    _json_float(self.estimate_interval[1]),
                ]
            ),
            "threshold": _json_float(self.threshold),
            "decision": self.decision,
            "samples": [int(self.samples[0]), int(self.samples[1])],
            "alpha": _json_float(self.alpha),
            "message": self.message,
            "required": self.required,
            "detectable": _json_float(self.detectable),
            "correlation_requests": _json_float(self.correlation_requests),
            "block_requests": self.block_requests,
            "warning": self.warning,
            "advisory": self.advisory,
        }


@dataclass(frozen=True)
class Verdict:
    """continue only when no check holds (`Check.holds`); reasons are the checks that do."""

    decision: GateDecision
    checks: tuple[Check, ...]
    reasons: tuple[Check, ...]
    notes: tuple[str, ...]

    @property
    def warnings(self) -> tuple[Check, ...]:
        """Checks in the warning tier that do not hold the gate (Check.warning)."""
        return tuple(c for c in self.checks if c.warning and not c.would_hold)

    @property
    def advisory(self) -> tuple[Check, ...]:
        """Advisory checks that failed (or stayed undecided where required): shown apart,
        holding nothing (policy.advisory)."""
        return tuple(c for c in self.checks if c.advisory_failed)

    @property
    def not_shown(self) -> tuple[Check, ...]:
        """Undecided checks that do not hold: what a continue did not show."""
        return tuple(c for c in self.checks if c.not_shown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "checks": [c.to_dict() for c in self.checks],
            "reasons": [c.to_dict() for c in self.reasons],
            "warnings": [c.to_dict() for c in self.warnings],
            "not_shown": [c.to_dict() for c in self.not_shown],
            "advisory": [c.to_dict() for c in self.advisory],
            "notes": list(self.notes),
        }
