"""The built-in scenario suite: named, typed, tunable workloads, and the probe runners.

Each entry is a frozen dataclass whose fields are its knobs with defaults; ``build(seed,
**overrides)`` returns a :class:`BuiltScenario` (requests plus either open-loop offsets or a
closed-loop concurrency, and the phases of a phased scenario). Overrides are field names, so
a gate spec entry such as ``{suite: peak, rate: 40}`` maps onto ``get("peak").build(seed,
rate=40)`` one to one, and a misspelt knob is an error naming the scenario's real knobs.

``plan(**overrides)`` checks the knobs as ``build`` would (the same errors, in the same order)
and returns the entry's :class:`~loadgen.schedule.PlannedSize` by arithmetic, in constant
time: a service validates and caps a caller's spec without building a schedule of a hundred
thousand requests inside the request that sent it.

Knobs are a caller's, so each is checked by type and bound whenever an entry is made
(:data:`RULES`, :func:`knob_problems`): real numbers, finite and bounded, ints for counts, and
an ``extra`` of allow-listed sampling parameters only (:data:`EXTRA_ALLOWED`; never the model,
the prompt, the stream, the output length or the fan-out, :data:`EXTRA_REFUSED`).

- ``normal``: steady Poisson at a nominal rate;
- ``peak``: the same at a higher sustained rate;
- ``overload``: nominal, then well beyond capacity, then nominal again;
- ``recovery``: the same shape, with the phase after the overload marked ``recovery`` so its
  latency can be compared with the ``baseline`` phase before it (how fast does it return?);
- ``capacity``: a paired search over offered rate for the highest rate each engine serves
  at a goodput target (:mod:`~loadgen.suite.capacity`);
- ``compatibility``: a fixed set of request shapes; :func:`run_probes` sends each and checks
  the answer against the OpenAI schema;
- ``correctness``: greedy probes with logprobs; :func:`run_correctness` returns per-probe
  token ids and logprobs for divergence checks between two engines.

The runners read every answer with a cap (:data:`~loadgen.client.MAX_BODY_BYTES`, and
:data:`MAX_MODELS_BODY_BYTES` for the model list) and end every request at the target's
``deadline_s``: an engine under test cannot make them read or wait without end.

The package, one module per concern: :mod:`~loadgen.suite.knobs` (the knob rules),
:mod:`~loadgen.suite.workloads` (the load entries), :mod:`~loadgen.suite.compatibility` and
:mod:`~loadgen.suite.schema` (the probe runner and its answer checks),
:mod:`~loadgen.suite.correctness` (greedy probes and teacher-forced scoring),
:mod:`~loadgen.suite.catalogue` (the entries by name). What callers use is re-exported here.
"""

from __future__ import annotations

from loadgen.brackets import Bracket, bracket
from loadgen.suite.capacity import Capacity, RateSearch, Step
from loadgen.suite.catalogue import SUITE, Scenario, get, knobs
from loadgen.suite.compatibility import (
    MAX_MODELS_BODY_BYTES,
    MAX_PROBE_CONTEXT,
    Compatibility,
    Probe,
    ProbeResult,
    default_probes,
    run_probes,
)
from loadgen.suite.correctness import (
    Correctness,
    CorrectnessResult,
    ScoreResult,
    first_divergence,
    run_correctness,
    score_continuations,
)
from loadgen.suite.knobs import (
    EXTRA_ALLOWED,
    EXTRA_REFUSED,
    MAX_SETTINGS_DEPTH,
    RULES,
    KnobError,
    knob_problems,
    nesting_depth,
)
from loadgen.suite.wire import ProbeKind
from loadgen.suite.workloads import BuiltScenario, Normal, Overload, Peak, Recovery, Steady

__all__ = [
    "EXTRA_ALLOWED",
    "EXTRA_REFUSED",
    "MAX_MODELS_BODY_BYTES",
    "MAX_PROBE_CONTEXT",
    "MAX_SETTINGS_DEPTH",
    "RULES",
    "SUITE",
    "Bracket",
    "BuiltScenario",
    "Capacity",
    "Compatibility",
    "Correctness",
    "CorrectnessResult",
    "KnobError",
    "Normal",
    "Overload",
    "Peak",
    "Probe",
    "ProbeKind",
    "ProbeResult",
    "RateSearch",
    "Recovery",
    "Scenario",
    "ScoreResult",
    "Steady",
    "Step",
    "bracket",
    "default_probes",
    "first_divergence",
    "get",
    "knob_problems",
    "knobs",
    "nesting_depth",
    "run_correctness",
    "run_probes",
    "score_continuations",
]
