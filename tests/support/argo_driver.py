"""One metric of an Argo Rollouts AnalysisRun, measured and assessed as Argo's code does it, in
virtual time. Followed from argoproj/argo-rollouts at 9f8d111d8f8e3e88b6d7f8bbdf62fd3cd863ef9d:

- analysis/analysis.go:28-30 `DefaultErrorRetryInterval = 10 * time.Second`, and :233-240 and
  :735-738: after an Error measurement the next one is 10 s after it finished, whatever the
  metric's `interval`; after any other, `interval` later.
- pkg/apis/rollouts/v1alpha1/analysis_types.go:159-169 `EffectiveCount`: no `count` and no
  `interval` is a count of 1 (measured once); `interval` without `count` runs until assessed.
- analysis.go:385-405: Successful, Failed and Inconclusive add to `Count`; Error does not, it
  adds to `ConsecutiveError` (reset by any other phase); only Successful adds to
  `ConsecutiveSuccess`.
- analysis.go:579-656 `assessMetricStatus` and :658-689 `assessMetricFailureInconclusiveOrError`:
  Failed past `failureLimit` (default 0), Inconclusive past `inconclusiveLimit` (default 0),
  Error past `consecutiveErrorLimit` (utils/defaults/defaults.go:37, default 4), checked in that
  order with the later winning; then `consecutiveSuccessLimit` reached is Successful; then a
  reached count is Successful (Inconclusive when a consecutiveSuccessLimit was set but not met).
- metricproviders/webmetric/webmetric.go:110-111: a non-2xx answer is an Error measurement, as
  is no answer within `timeoutSeconds`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ERROR_RETRY_S = 10.0
DEFAULT_CONSECUTIVE_ERROR_LIMIT = 4
Measure = Callable[[float], tuple[str, float]]  # virtual time -> (phase, seconds it took)


def duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


@dataclass
class MetricRun:
    metric: dict[str, Any]
    successful: int = 0
    failed: int = 0
    inconclusive: int = 0
    error: int = 0
    count: int = 0
    consecutive_error: int = 0
    consecutive_success: int = 0
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (finished at, phase)

    def _limit(self, name: str, default: int) -> int:
        value = self.metric.get(name)
        return default if value is None else int(value)

    def effective_count(self) -> int | None:
        count = self.metric.get("count")
        if not count:
            return None if self.metric.get("interval") else 1
        return int(count)

    def record(self, phase: str) -> None:
        if phase == "Successful":
            self.successful += 1
            self.count += 1
            self.consecutive_error = 0
            self.consecutive_success += 1
        elif phase == "Failed":
            self.failed += 1
            self.count += 1
            self.consecutive_error = 0
            self.consecutive_success = 0
        elif phase == "Inconclusive":
            self.inconclusive += 1
            self.count += 1
            self.consecutive_error = 0
            self.consecutive_success = 0
        elif phase == "Error":
            self.error += 1
            self.consecutive_error += 1
            self.consecutive_success = 0
        else:
            raise ValueError(phase)

    def assess(self) -> str:
        """`assessMetricStatus` after a completed measurement: a final phase or Running."""
        phase = ""
        failure_limit = self._limit("failureLimit", 0)
        if failure_limit >= 0 and self.failed > failure_limit:
            phase = "Failed"
        if self.inconclusive > self._limit("inconclusiveLimit", 0):
            phase = "Inconclusive"
        if self.consecutive_error > self._limit(
            "consecutiveErrorLimit", DEFAULT_CONSECUTIVE_ERROR_LIMIT
        ):
            phase = "Error"
        if phase:
            return phase
        success_limit = self._limit("consecutiveSuccessLimit", 0)
        if success_limit > 0 and self.consecutive_success >= success_limit:
            return "Successful"
        count = self.effective_count()
        if count is not None and self.count >= count:
            failure_applicable = self.metric.get("failureLimit") is None or failure_limit >= 0
            if failure_applicable and success_limit > 0:
                return "Inconclusive"
            if success_limit > 0:
                return "Failed"
            return "Successful"
        return "Running"

    def run(self, measure: Measure, *, until_s: float = 7 * 86_400) -> str:
        """Measure until the metric is assessed; returns its phase (Running past `until_s`)."""
        now = 0.0
        interval = duration_s(self.metric["interval"]) if self.metric.get("interval") else None
        while now <= until_s:
            phase, took = measure(now)
            now += took
            self.record(phase)
            self.timeline.append((now, phase))
            verdict = self.assess()
            if verdict != "Running":
                return verdict
            if phase == "Error":
                now += ERROR_RETRY_S
            elif interval is not None:
                now += interval
            else:
                return "Running"  # measured once, never again (EffectiveCount is 1)
        return "Running"
