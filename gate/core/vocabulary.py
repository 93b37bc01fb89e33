"""The words every stage of a gate shares, as types: who is compared, where a gate is, what was
decided. One place, so a new state or role is added once and the type checker finds every
`match` and table that must learn it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Role = Literal["reference", "candidate"]
ROLES: Final[tuple[Role, ...]] = get_args(Role)

GateState = Literal["pending", "running", "complete", "error", "cancelled"]
FinishedState = Literal["complete", "error", "cancelled"]
STATES: Final[tuple[GateState, ...]] = get_args(GateState)
FINISHED: Final[tuple[FinishedState, ...]] = get_args(FinishedState)
ACTIVE: Final[tuple[GateState, ...]] = ("pending", "running")

GateDecision = Literal["continue", "hold"]  # the gate's verdict
VERDICTS: Final[tuple[GateDecision, ...]] = get_args(GateDecision)
CheckDecision = Literal["pass", "fail", "undecided"]  # one check's

CheckGroup = Literal[
    "latency",
    "errors",
    "startup",
    "crash",
    "correctness",
    "compatibility",
    "peak",
    "overload",
    "recovery",
    "engine",
    "capacity",
    "gpu",
]

# Exit codes of `gate run` (and the document's `exit_code`).
EXIT_CONTINUE: Final = 0
EXIT_HOLD: Final = 1
EXIT_ERROR: Final = 2
EXIT_INTERRUPTED: Final = 130
