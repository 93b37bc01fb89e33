"""The whole gate spec: two engines, the scenarios, the shape and the policy."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from gate.analysis.policy import Policy
from gate.core.vocabulary import Role
from gate.spec.engines import EngineSpec
from gate.spec.fields import Name, StrictModel
from gate.spec.notify import MAX_NOTIFY, NotifySpec
from gate.spec.scenarios import ScenarioSpec
from gate.spec.shape import ShapeSpec


class TelemetrySpec(StrictModel):
    """How the gate samples what the engines say about themselves during every load scenario
    (gate/telemetry; docs/telemetry.md)."""

    enabled: bool = Field(
        default=True,
        description="scrape each engine's metrics endpoint (EngineSpec.metrics_path) while "
        "each load scenario runs; off: no engine checks, one note",
    )
    interval_s: float = Field(
        default=1.0,
        ge=0.05,
        le=60.0,
        description="seconds between scrapes (0.05 to 60): at 1 s a scrape costs the gate "
        "well under a percent of a core (docs/performance.md)",
    )
    timeout_s: float = Field(
        default=2.0,
        gt=0.0,
        le=30.0,
        description="a scrape that takes longer is a gap in the timeline, never an error",
    )


def _yaml_switch(v: Any) -> Any:
    """YAML 1.1 (PyYAML, what reads every spec file) reads a bare `off` as false and `on` as
    true: `correctness: off`, as documented, arrives as False. A switch means what it says."""
    if v is False:
        return "off"
    if v is True:
        return "auto"
    return v


class GateSpec(StrictModel):
    name: Name
    model: str = Field(
        min_length=1,
        max_length=500,
        pattern=r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*$",
        description="the served model name, also `{model}` in argv: letters, digits and "
        "`_./:@+=-`, never starting with '-' (it would read as an option), no `$` (Kubernetes "
        "would expand `$(VAR)`), no spaces",
    )
    reference: EngineSpec
    candidate: EngineSpec
    scenarios: list[ScenarioSpec] = Field(min_length=1, max_length=100)
    shape: ShapeSpec = Field(default_factory=ShapeSpec)
    inventory: str | None = Field(
        default=None, description="inventory YAML; default: settings, then the local example"
    )
    policy: Policy = Field(default_factory=Policy)
    telemetry: TelemetrySpec = Field(
        default_factory=TelemetrySpec,
        description="sampling the engines' own metrics during each load scenario",
    )
    correctness: Annotated[Literal["auto", "off"], BeforeValidator(_yaml_switch)] = Field(
        default="auto",
        description="'auto' (or true): when no scenario is a correctness suite, the gate runs "
        "a short one (the suite's defaults: 8 greedy probes, seconds) after the listed "
        "scenarios, so numerical divergence is judged in every gate; 'off' (or false, what "
        "YAML makes of a bare `off`): none is added (the verdict says so in a note; the load "
        "scenarios' outputs are still compared for gross divergence).",
    )
    notify: list[NotifySpec] = Field(
        default_factory=list,
        max_length=MAX_NOTIFY,
        description="verdict alerts: operator targets by name, or allow-listed webhook URLs "
        "(gate/spec/notify.py); sent by the service when the gate ends",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="seconds the whole gate may take, from its start (waiting for capacity, "
        "launching, every scenario, judging); past it the gate stops and holds naming it. "
        "Default: the operator's GATE_DEADLINE_S; at most GATE_MAX_DEADLINE_S.",
    )

    def engine(self, role: Role) -> EngineSpec:
        return self.reference if role == "reference" else self.candidate

    @property
    def added_correctness(self) -> ScenarioSpec | None:
        """The correctness stage the gate adds (`correctness: auto` and no correctness
        scenario listed), named `correctness` unless a listed scenario has that name."""
        if self.correctness == "off" or any(s.suite == "correctness" for s in self.scenarios):
            return None
        taken = {s.name for s in self.scenarios}
        name = "correctness"
        for i in itertools.count(2):
            if name not in taken:
                break
            name = f"correctness-{i}"
        return ScenarioSpec(name=name, suite="correctness")

    @property
    def stages(self) -> list[ScenarioSpec]:
        """Every scenario the gate runs, in order: the listed ones, then an added
        correctness stage (`added_correctness`)."""
        added = self.added_correctness
        return [*self.scenarios, added] if added is not None else list(self.scenarios)

    @field_validator("scenarios")
    @classmethod
    def _one_load_scenario(cls, scenarios: list[ScenarioSpec]) -> list[ScenarioSpec]:
        """Latency is judged only on load scenarios, not on a capacity search's steps: a gate
        that searches for capacity without one would hold on `latency.coverage` every time,
        after the search; refused before it runs. (A gate of probes alone is allowed, as a
        diagnostic of outputs: it holds on coverage too, and says so.)"""
        capacity = [s.name for s in scenarios if s.is_capacity]
        if capacity and not any(s.is_load for s in scenarios):
            raise ValueError(
                f"capacity scenario {capacity[0]!r} needs a load scenario beside it: latency "
                "is compared only on load scenarios, so without one the gate holds on "
                "latency.coverage every time; add one below both engines' capacity, e.g. "
                "{name: steady, rate: 20, requests: 400}"
            )
        return scenarios

    @model_validator(mode="after")
    def _unique_scenarios(self) -> GateSpec:
        names = [s.name for s in self.scenarios]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"scenario names must be unique; repeated: {', '.join(dupes)}")
        return self
