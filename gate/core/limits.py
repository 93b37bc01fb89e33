"""Caps on what one gate spec may make the gate spend: requests, seconds, tokens, probes.

A spec is a caller's document, and the gate turns it into GPU time, HTTP requests, memory and
CPU. The field bounds of `gate/spec/` only keep a spec meaningful (a rate above zero); these
caps keep it affordable, and they belong to the operator, not to the spec's author: each is a
setting (`GATE_MAX_...`: `Settings` and `Limits` both are `Caps`, so each cap is declared
once, here, with its default, bound and description) read by the API
(`gate/service/admission.py`), by `gate run`, and by the runner itself before it reserves
anything (a stored spec is checked again under the settings of the worker that runs it). A
spec is checked against them by `gate.spec.spec_limit_problems` (`gate/spec/limits.py`).

Sizes are the planned ones, computed by arithmetic from the spec (`loadgen.suite` entries'
`plan()`, `loadgen.schedule.plan_offsets`), never by building a schedule: for a Poisson or
gamma duration the count is random and its expectation is what is capped (the drawn count is
within a few standard deviations of it). A closed loop run for a duration has no planned
count; the runner stops it at the per-scenario cap.

| setting (GATE_...)          | default | what it bounds                                          |
|-----------------------------|---------|---------------------------------------------------------|
| max_scenario_requests       |  20000  | planned requests per arm of one scenario (a suite's too)|
| max_gate_requests           | 100000  | planned requests per arm of all scenarios, extensions in|
| max_scenario_duration_s     |   3600  | planned seconds of load of one scenario                 |
| max_scenarios               |     20  | scenarios in one spec                                   |
| max_prompt_tokens           |  32768  | prompt_tokens, and a compatibility suite's max_model_len|
| max_output_tokens           |   8192  | max_tokens (and max_tokens-like keys of a suite's extra)|
| max_workload_file_bytes     | 67108864 | bytes of one workload file (a scenario's workload.file) |
| max_workload_records        | 100000  | records (non-blank lines) of one workload file          |
| max_session_turns           |     64  | turns of one multi-turn session                         |
| max_probes                  |    256  | a correctness suite's probes_count                      |
| max_envelope_load           |    256  | a correctness suite's envelope_load (background streams)|
| max_concurrency             |   1024  | concurrency of a closed-loop scenario                   |
| max_rate                    |   2000  | requests/s of any scenario or phase (overload_rate too) |
| max_wait_s                  |   3600  | shape.wait_s, the wait for capacity                     |
| max_readiness_timeout_s     |   3600  | each engine's readiness_timeout_s                       |
| max_deadline_s              |  14400  | deadline_s, the whole gate's deadline a spec may ask for|
| deadline_s                  |   3600  | the gate's deadline when the spec gives none            |
| scenario_deadline_factor    |      2  | a scenario's deadline: planned seconds x this ...       |
| scenario_deadline_slack_s   |    300  | ... plus this (the last requests finishing, the looks)  |

The last three are not caps but the deadlines the runner enforces (`gate/runs/runner.py` and
`gate/runs/scenarios.py`): past the gate's deadline the gate stops, wherever it is, and holds
naming it; a scenario past its own deadline is stopped and the gate holds naming it. A
scenario without planned seconds (a closed loop of a number of requests, the probe suites)
gets max_scenario_duration_s as its planned seconds.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Caps", "Limits", "scenario_deadline_s"]


class Caps(BaseModel):
    """The caps' one declaration: `Limits` (what a check reads) and `Settings` (where the
    operator sets them, as GATE_<NAME>) both are these fields."""

    max_scenario_requests: int = Field(
        default=20_000,
        ge=1,
        description="Planned requests per arm of one scenario, a suite's included (a closed "
        "loop run for a duration is stopped there).",
    )
    max_gate_requests: int = Field(
        default=100_000,
        ge=1,
        description="Planned requests per arm of all of a gate's scenarios together, the "
        "policy's extensions of steady scenarios included.",
    )
    max_scenario_duration_s: float = Field(
        default=3_600.0,
        gt=0,
        description="Planned seconds of load of one scenario (its duration_s, requests / rate, "
        "or a phased suite's phases).",
    )
    max_scenarios: int = Field(default=20, ge=1, description="Scenarios in one gate spec.")
    max_prompt_tokens: int = Field(
        default=32_768,
        ge=1,
        description="A scenario's prompt_tokens (a suite's too) and a compatibility suite's "
        "max_model_len (its long-prompt probes are that long).",
    )
    max_output_tokens: int = Field(
        default=8_192,
        ge=1,
        description="A scenario's max_tokens, and max_tokens-like keys in a suite's extra body.",
    )
    max_workload_file_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="Bytes of one workload file (a scenario's workload.file): checked before it "
        "is read. Its records' prompt and output lengths meet max_prompt_tokens and "
        "max_output_tokens, a trace's span max_scenario_duration_s, its requests "
        "max_scenario_requests.",
    )
    max_workload_records: int = Field(
        default=100_000, ge=1, description="Records (non-blank lines) of one workload file."
    )
    max_session_turns: int = Field(
        default=64, ge=1, description="Turns of one multi-turn session of a workload."
    )
    max_probes: int = Field(default=256, ge=1, description="A correctness suite's probes_count.")
    max_envelope_load: int = Field(
        default=256,
        ge=0,
        description="A correctness suite's envelope_load: generation requests kept in flight "
        "on the reference while it repeats the probes.",
    )
    max_concurrency: int = Field(
        default=1_024,
        ge=1,
        description="Requests in flight per engine of a closed-loop scenario.",
    )
    max_rate: float = Field(
        default=2_000.0,
        gt=0,
        description="Requests per second of any scenario or phase (a suite's overload_rate too).",
    )
    max_wait_s: float = Field(
        default=3_600.0,
        ge=0,
        description="A spec's shape.wait_s: how long a gate may wait for capacity.",
    )
    max_readiness_timeout_s: float = Field(
        default=3_600.0,
        gt=0,
        description="An engine's readiness_timeout_s.",
    )
    max_deadline_s: float = Field(
        default=14_400.0,
        gt=0,
        description="The longest deadline_s a spec may ask for its whole gate.",
    )
    deadline_s: float = Field(
        default=3_600.0,
        gt=0,
        description="A gate's deadline when its spec gives none: past it the gate stops "
        "wherever it is (waiting, launching, a scenario, judging), holds naming the deadline, "
        "tears its engines down and releases its GPUs.",
    )
    scenario_deadline_factor: float = Field(
        default=2.0,
        ge=1,
        description="A scenario's deadline is its planned seconds times this, plus "
        "scenario_deadline_slack_s (unplanned: max_scenario_duration_s instead); past it the "
        "scenario is stopped and the gate holds naming the deadline.",
    )
    scenario_deadline_slack_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds added to every scenario's deadline: the last requests finishing, "
        "the looks, an extension's decision.",
    )


class _AsksDeadline(Protocol):
    @property
    def deadline_s(self) -> float | None: ...


class Limits(Caps):
    """The operator's caps (module docstring); field names are the settings' names."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def from_settings(cls, settings: Caps) -> Limits:
        return cls(**{name: getattr(settings, name) for name in Caps.model_fields})

    def gate_deadline_s(self, spec: _AsksDeadline) -> float:
        """The spec's deadline, or the default; never above the cap."""
        asked = spec.deadline_s if spec.deadline_s is not None else self.deadline_s
        return min(asked, self.max_deadline_s)


def scenario_deadline_s(planned_s: float | None, limits: Limits) -> float:
    """How long a scenario may run: its planned seconds (or, unplanned, the cap on them) times
    the factor, plus the slack."""
    base = limits.max_scenario_duration_s if planned_s is None else planned_s
    return base * limits.scenario_deadline_factor + limits.scenario_deadline_slack_s
