"""The suite by name: ``get(name, **knobs)`` makes an entry, ``knobs(name)`` lists its knobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadgen.suite.capacity import Capacity
from loadgen.suite.compatibility import Compatibility
from loadgen.suite.correctness import Correctness
from loadgen.suite.knobs import knob_fields, replace_knobs
from loadgen.suite.workloads import Normal, Overload, Peak, Recovery

Scenario = Normal | Peak | Overload | Recovery | Capacity | Compatibility | Correctness

SUITE: dict[str, Callable[[], Scenario]] = {
    "normal": Normal,
    "peak": Peak,
    "overload": Overload,
    "recovery": Recovery,
    "capacity": Capacity,
    "compatibility": Compatibility,
    "correctness": Correctness,
}


def get(name: str, **overrides: Any) -> Scenario:
    """The suite entry ``name`` with its defaults replaced by ``overrides``."""
    if name not in SUITE:
        raise ValueError(f"scenario: unknown {name!r} (choose from {', '.join(SUITE)})")
    scenario: Scenario = replace_knobs(SUITE[name](), overrides)
    return scenario


def knobs(name: str) -> list[str]:
    """The overridable fields of a suite entry, for help texts and spec validation."""
    return [f.name for f in knob_fields(get(name))]
