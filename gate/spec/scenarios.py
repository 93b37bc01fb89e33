"""A load scenario: explicit (arrival, rate, requests) or a named suite entry with its knobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from pydantic import (
    Field,
    model_validator,
)

from gate.spec.fields import Name, StrictModel
from gate.spec.workloads import WorkloadSpec, workload_problems

if TYPE_CHECKING:
    from loadgen.schedule import Arrival

SUITES = ("normal", "peak", "overload", "recovery", "compatibility", "correctness", "capacity")
LOAD_SUITES = ("normal", "peak", "overload", "recovery")
SUITE_OWN_KEYS = ("name", "suite", "api", "settings")


def suite_knob_problems(suite: str, knobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each knob the suite does not have; else for each knob nested too
    deep and each value the suite refuses by type or bound (the key names the knob, `extra.n`
    for a key of its `extra`); else for the settings taken together (`settings`)."""
    from loadgen import suite as catalogue

    known = catalogue.knobs(suite)
    out = [
        (_knob_name(k), f"not a setting of suite {suite} (its settings: {', '.join(known)})")
        for k in knobs
        if k not in known
    ]
    if out:
        return out
    limit = catalogue.MAX_SETTINGS_DEPTH - 1  # the settings themselves are the first level
    shallow: dict[str, Any] = {}
    for k, v in knobs.items():
        if catalogue.nesting_depth(v, limit) > limit:
            out.append(
                (
                    k,
                    f"nested too deep: a suite's settings are at most "
                    f"{catalogue.MAX_SETTINGS_DEPTH} levels of objects and lists, the settings "
                    "counted (settings.extra.stop is 3)",
                )
            )
        else:
            shallow[k] = v
    out += [
        (knob, f"suite {suite} rejects {knob}: {why}")
        for knob, why in catalogue.knob_problems(suite, shallow)
    ]
    if out:
        return out
    try:
        # By arithmetic: the schedule is built by the gate that runs it, not by its validation.
        catalogue.get(suite, **knobs).plan()
    except catalogue.KnobError as exc:  # a rule between knobs, named by the knob it refuses
        return [(exc.knob, f"suite {suite} rejects {exc.knob}: {exc.reason}")]
    except (ValueError, TypeError, ArithmeticError) as exc:
        return [("settings", f"suite {suite} rejects these settings: {exc}")]
    return []


def _knob_name(key: Any) -> str:
    """A caller's knob name as a field path shows it: at most 40 characters."""
    text = str(key)
    return text if len(text) <= 40 else text[:40] + "…"


class OpenLoop(TypedDict):
    """The arguments of an open-loop scenario's schedule, as `loadgen.schedule.build_offsets`
    (and `plan_offsets`, which sizes it without drawing) take them."""

    arrival: Arrival
    rate: float
    requests: int | None
    duration_s: float | None
    burstiness: float


class ScenarioSpec(StrictModel):
    """One load scenario: explicit (arrival, rate, requests, ...) or a named `suite` entry
    (normal, peak, overload, recovery, capacity, compatibility, correctness) with its
    settings given
    as plain keys, e.g. `{suite: peak, rate: 40}`."""

    name: Name
    suite: Literal[SUITES] | None = None  # type: ignore[valid-type]
    settings: dict[str, Any] = Field(default_factory=dict, description="the suite's knobs")
    api: Literal["completions", "chat"] = "completions"
    arrival: Literal["poisson", "constant", "gamma", "concurrency"] = "poisson"
    rate: float | None = Field(default=None, gt=0, le=100_000, description="requests/s")
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    burstiness: float = Field(default=1.0, gt=0, description="gamma shape; 1 = Poisson")
    requests: int | None = Field(default=None, ge=1, le=10_000_000)
    duration_s: float | None = Field(default=None, gt=0, le=86_400)
    prompt_tokens: int = Field(default=128, ge=1, le=1_000_000)
    max_tokens: int = Field(default=32, ge=1, le=1_000_000)
    ignore_eos: bool = Field(default=True, description="fixed output lengths keep ITL comparable")
    temperature: float = Field(default=0.0, ge=0, le=2)
    workload: WorkloadSpec | None = Field(
        default=None,
        description="where the requests come from: files, sessions, shared prefixes, long "
        "contexts, a mix (docs/workloads.md); unset: prompt_tokens of synthetic words",
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_suite_knobs(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("suite") is not None:
            d = dict(data)
            d.setdefault("name", d["suite"])
            knobs = {k: d.pop(k) for k in list(d) if k not in SUITE_OWN_KEYS}
            settings = d.get("settings")
            d["settings"] = {**(settings if isinstance(settings, Mapping) else {}), **knobs}
            return d
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioSpec:
        if self.suite is not None:
            problems = suite_knob_problems(self.suite, self.settings)
        else:
            if self.settings:
                raise ValueError("`settings` belongs to a suite scenario; add `suite: NAME`")
            problems = scenario_cross_field_problems(self.model_dump(exclude_unset=True))
        if problems:
            raise ValueError(problems[0][1])
        return self

    def open_loop(self) -> OpenLoop:
        """Its open loop's arguments (a rate is set). A closed loop's `concurrency` arrival is
        passed on as it is, for `plan_offsets` to refuse by name."""
        assert self.rate is not None
        return OpenLoop(
            arrival=cast("Arrival", self.arrival),
            rate=self.rate,
            requests=self.requests,
            duration_s=self.duration_s,
            burstiness=self.burstiness,
        )

    @property
    def is_probe(self) -> bool:
        return self.suite in ("compatibility", "correctness")

    @property
    def is_capacity(self) -> bool:
        """A paired search over offered rate (gate/runs/capacity.py): no fixed schedule, so
        no plan of looks; sized by its step budget (loadgen/suite/capacity.py)."""
        return self.suite == "capacity"

    @property
    def is_load(self) -> bool:
        """A fixed schedule of paired requests whose latencies the judge compares: every
        scenario but the probes and the capacity search."""
        return not (self.is_probe or self.is_capacity)


def scenario_cross_field_problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rules that tie fields together, checked on the raw mapping so they are reported alongside
    every field-level mistake instead of being hidden behind them."""
    out: list[tuple[str, str]] = []
    arrival = raw.get("arrival", "poisson")
    has = {k: raw.get(k) is not None for k in ("rate", "concurrency", "requests", "duration_s")}
    workload = raw.get("workload")
    if workload is not None:
        return workload_problems(workload) + _workload_scenario_problems(workload, arrival, has)
    if arrival == "concurrency":
        if not has["concurrency"]:
            out.append(("concurrency", "required when arrival is concurrency"))
        if has["rate"]:
            out.append(("rate", "not used with arrival concurrency; remove it"))
    elif arrival in ("poisson", "constant", "gamma"):
        if not has["rate"]:
            out.append(("rate", f"required when arrival is {arrival} (requests/s)"))
        if has["concurrency"]:
            out.append(("concurrency", "only used with arrival: concurrency"))
    if has["requests"] == has["duration_s"]:
        out.append(("requests", "give exactly one of `requests` or `duration_s`"))
    return out


def _is_trace(workload: Any) -> bool:
    if not isinstance(workload, Mapping):
        return False
    parts = workload.get("mix", [workload])
    return isinstance(parts, list) and any(
        isinstance(p, Mapping) and p.get("kind") == "trace" for p in parts
    )


def _workload_scenario_problems(
    workload: Any, arrival: Any, has: Mapping[str, bool]
) -> list[tuple[str, str]]:
    """A workload is sent open loop: a trace at its own instants (`rate`: time-scaled to
    it; `requests` or `duration_s`: the first ones), any other at the scenario's arrivals."""
    out: list[tuple[str, str]] = []
    if arrival == "concurrency" or has["concurrency"]:
        out.append(("arrival", "a workload is sent open loop: use poisson, constant or gamma"))
    if _is_trace(workload):
        if has["requests"] and has["duration_s"]:
            out.append(("requests", "give at most one of `requests` or `duration_s`"))
        return out
    if not has["rate"]:
        out.append(("rate", "required with a workload: its sessions or requests start per second"))
    if has["requests"] == has["duration_s"]:
        out.append(("requests", "give exactly one of `requests` or `duration_s`"))
    return out
