"""The statistical policy a gate spec embeds: error budget, tolerances and checks.

Weighted Bonferroni (see statistics.md, "Many checks at once"): each check group j gets
alpha * w_j with the weights summing to 1, which controls the family-wise false-hold rate under
any dependence between checks and under optional stopping, because every test inside is
anytime-valid.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = ["AUTO_QUANTILES", "CHECK_GROUPS", "Metric", "Policy", "quantile_key"]

AUTO_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
CHECK_GROUPS: tuple[str, ...] = ("latency", "errors", "correctness")

_KEY = re.compile(r"^p(\d+(?:\.\d+)?)$")


def quantile_key(q: float) -> str:
    """The tolerance key of a quantile: 0.5 -> "p50", 0.99 -> "p99", 0.999 -> "p99.9"."""
    return f"p{round(q * 100.0, 6):g}"


Metric = Literal["ttft", "itl"]


def _default_metrics() -> list[Metric]:
    return ["ttft", "itl"]


class Policy(BaseModel):
    """How strict the gate is. Defaults suit a mirrored-load comparison of a few hundred to a few
    thousand requests per scenario and arm."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(
        default=0.05,
        gt=0.0,
        lt=0.5,
        description=(
            "Family-wise false-hold budget: the probability that the gate holds a candidate "
            "that is as good as the reference, across all checks and however often it looks."
        ),
    )
    alpha_split: dict[str, float] = Field(
        default_factory=lambda: {"latency": 0.4, "errors": 0.2, "correctness": 0.4},
        description=(
            "Share of alpha per check group (weighted Bonferroni). Keys: latency, errors, "
            "correctness; weights >= 0 summing to 1, latency > 0."
        ),
    )
    quantiles: Literal["auto"] | list[float] = Field(
        default="auto",
        description=(
            "Latency quantiles to compare. 'auto' checks those of 0.5, 0.9, 0.99 that the "
            "available samples can bound on both sides; listed quantiles are required, and one "
            "the samples cannot decide is inconclusive (hold)."
        ),
    )
    tolerance: dict[str, float] = Field(
        default_factory=lambda: {"p50": 0.05, "p90": 0.10, "p99": 0.15},
        validate_default=True,
        description=(
            "Allowed relative increase of the candidate over the reference per quantile, keyed "
            "'p50', 'p90', 'p99', 'p99.9'; 0.10 allows the candidate up to 1.10x."
        ),
    )
    metrics: list[Metric] = Field(
        default_factory=_default_metrics,
        description="Latency metrics to compare: time to first token, mean inter-token latency.",
    )
    max_error_rate: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description=(
            "Absolute ceiling on the candidate's error fraction in each scenario, applied in "
            "addition to the statistical comparison with the reference."
        ),
    )
    startup_tolerance: float = Field(
        default=0.5,
        ge=0.0,
        description=(
            "The candidate may take up to (1 + startup_tolerance) x the reference's time to "
            "become ready, plus startup_slack_s."
        ),
    )
    startup_slack_s: float = Field(
        default=5.0,
        ge=0.0,
        description="Seconds added to the startup allowance so that fast engines are not held "
        "for a few seconds of jitter.",
    )
    warmup_requests: int = Field(
        default=8,
        ge=0,
        description="Requests discarded at the start of each scenario (compilation, CUDA graph "
        "capture); the gate applies it before judging.",
    )

    @field_validator("alpha_split")
    @classmethod
    def _check_split(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(CHECK_GROUPS))
        if unknown:
            raise ValueError(
                f"unknown check group(s) {unknown}; expected exactly {list(CHECK_GROUPS)}"
            )
        missing = [g for g in CHECK_GROUPS if g not in v]
        if missing:
            raise ValueError(f"missing weight(s) for {missing}; give all of {list(CHECK_GROUPS)}")
        for key, w in v.items():
            if not (math.isfinite(w) and w >= 0.0):
                raise ValueError(f"weight for {key!r} must be >= 0, got {w}")
        if v["latency"] <= 0.0:
            raise ValueError("the latency weight must be > 0: a gate continues only on latency")
        total = math.fsum(v.values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"weights must sum to 1, got {total:g}")
        return v

    @field_validator("quantiles")
    @classmethod
    def _check_quantiles(cls, v: Literal["auto"] | list[float]) -> Literal["auto"] | list[float]:
        if v == "auto":
            return v
        if not v:
            raise ValueError("list at least one quantile, or use 'auto'")
        for q in v:
            if not 0.0 < q < 1.0:
                raise ValueError(f"quantiles must be in (0, 1), got {q}")
        if len({quantile_key(q) for q in v}) != len(v):
            raise ValueError("quantiles must be distinct")
        return sorted(v)

    @field_validator("tolerance")
    @classmethod
    def _check_tolerance(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, tol in v.items():
            m = _KEY.match(key)
            if m is None or not 0.0 < float(m.group(1)) < 100.0:
                raise ValueError(f"key {key!r} is not a quantile key like 'p90'")
            if not (math.isfinite(tol) and tol >= 0.0):
                raise ValueError(f"tolerance for {key!r} must be >= 0, got {tol}")
            out[quantile_key(float(m.group(1)) / 100.0)] = tol
        quantiles = info.data.get("quantiles", "auto")
        wanted = AUTO_QUANTILES if quantiles == "auto" else quantiles
        missing = [quantile_key(q) for q in wanted if quantile_key(q) not in out]
        if missing:
            raise ValueError(f"no tolerance for {missing}, which the quantiles setting checks")
        return out

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, v: list[Metric]) -> list[Metric]:
        if not v:
            raise ValueError("list at least one metric")
        if len(set(v)) != len(v):
            raise ValueError("metrics must be distinct")
        return v

    @property
    def checked_quantiles(self) -> tuple[float, ...]:
        """The quantiles the judge considers (auto: the candidates it may drop)."""
        return AUTO_QUANTILES if self.quantiles == "auto" else tuple(self.quantiles)

    def tolerance_for(self, q: float) -> float:
        """Allowed relative increase at quantile q (validated to exist for every checked q)."""
        return self.tolerance[quantile_key(q)]

    def group_alpha(self, group: str) -> float:
        """The share of the family-wise budget that one check group may spend."""
        return self.alpha * self.alpha_split[group]
