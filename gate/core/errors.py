"""One error hierarchy for the whole gate.

Every error a user can cause or meet carries a message that names the problem and, where it has
one, an HTTP status, so the CLI, the API and the task layer render errors the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class GateError(Exception):
    """Base of every error the gate raises on purpose."""

    status_code: int = 500
    code: str = "gate_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One mistake in a user document: where it is (a dotted path) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


MAX_PROBLEMS = 50  # a document with more mistakes than this is named by its first ones


class SpecError(GateError):
    """A gate spec that cannot be used; names every mistake, not only the first (up to
    MAX_PROBLEMS: an answer stays small whatever the request)."""

    status_code = 422
    code = "invalid_spec"

    def __init__(self, problems: list[FieldProblem], source: str = "spec") -> None:
        self.all_problems = problems  # every one, for a caller that merges them with others
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            problems = [
                *problems[:MAX_PROBLEMS],
                FieldProblem("(spec)", f"and {more} more mistake{'s' if more > 1 else ''}"),
            ]
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        count = len(self.all_problems)  # all of them, though only the first are listed
        noun = "mistake" if count == 1 else "mistakes"
        super().__init__(f"{source} has {count} {noun}:\n{lines}")


class WorkloadError(SpecError):
    """A scenario's workload that cannot be used: a file outside the operator's directory,
    unreadable, over a cap, or with a mistake at a line and field (gate/runs/workloads.py).
    Refused like any spec mistake (422, `invalid_spec`)."""


class ReservationError(GateError):
    """No GPU shape could be reserved; the message says which layer blocked."""

    status_code = 409
    code = "reservation_blocked"


class BlockedReason(Protocol):
    """What a reservation blocked on says of itself (gate/reservations/shapes.py `Blocked`):
    named here by what it has, so gate/core imports nothing above it."""

    @property
    def code(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def retryable(self) -> bool: ...


_Reason = TypeVar("_Reason", bound=BlockedReason)


class BlockedReservation(ReservationError, Generic[_Reason]):
    def __init__(self, blocked: _Reason) -> None:
        self.blocked: _Reason = blocked
        super().__init__(f"no GPU shape could be reserved ({blocked.code}): {blocked.message}")


class EngineError(GateError):
    """An engine could not be launched, reached or kept alive."""

    status_code = 502
    code = "engine_error"

    def __init__(self, role: str, phase: str, message: str) -> None:
        self.role = role
        self.phase = phase
        super().__init__(f"{role} engine {message}")


class PortTaken(EngineError):
    """The engine's port answered from another process's socket, not the engine's: something
    else bound it between the pick and the engine's bind (the engine is relaunched elsewhere)."""


class EngineUnreachable(EngineError):
    """Nothing answers at the engine's address."""

    code = "engine_unreachable"


class ReadinessTimeout(EngineError):
    """The engine did not become ready in time; `phase` is where it stuck."""

    code = "readiness_timeout"


class GateCancelled(GateError):
    """The run was interrupted (Ctrl-C, SIGTERM or an API cancel)."""

    status_code = 409
    code = "cancelled"


class DeadlinePassed(GateError):
    """The gate, or one of its scenarios, ran past its deadline (gate/core/limits.py): it was
    stopped there and holds, its engines torn down and its GPUs released."""

    status_code = 504
    code = "deadline"


# -- gates and their callers ------------------------------------------------------------------


class GateNotFound(GateError):
    status_code = 404
    code = "not_found"

    def __init__(self, gate_id: str) -> None:
        super().__init__(f"no gate with id {gate_id!r}")


class HistoryNotFound(GateError):
    """No finished gate of this spec identity (gate/spec/identity.py)."""

    status_code = 404
    code = "history_not_found"

    def __init__(self, identity: str) -> None:
        super().__init__(f"no gate history for spec identity {identity!r}")


class GateConflict(GateError):
    status_code = 409
    code = "conflict"


class GateForbidden(GateError):
    status_code = 403
    code = "forbidden"


class TooBusy(GateError):
    status_code = 429
    code = "too_busy"


# An owner's cap on active gates (GATE_MAX_ACTIVE_GATES_PER_TOKEN) is a TooBusy: the same 429
# `too_busy` answer, one code for one meaning.
class TooManyGates(TooBusy):
    pass


# -- the rest of the service ------------------------------------------------------------------


class TokenError(GateError):
    status_code = 422
    code = "invalid_token_request"


# Still a ValueError too, as it was before it joined this family.
class UrlRefused(GateError, ValueError):
    """A URL the gate will not call; the message says why and which setting would allow it."""

    status_code = 422
    code = "url_refused"


class WorkerStopping(GateError):
    """This process is shutting down and takes no new gate; the gate stays pending."""

    status_code = 503
    code = "worker_stopping"


class ClusterError(GateError):
    """The cluster cannot be reached or read with the configuration the spec gives."""

    status_code = 502
    code = "cluster_error"


class InvalidSamples(GateError, ValueError):
    """Samples handed to the judge that no statistic can use (NaN or infinite values): names
    the field and the first bad position, so a bad measurement is found, not averaged."""

    status_code = 422
    code = "invalid_samples"


class ShortScenario(GateError, ValueError):
    """A load scenario whose planned size makes too few time blocks for any paired check to
    decide (analysis/plan.py): refused before the load, with the size it needs."""

    status_code = 422
    code = "scenario_too_short"

    def __init__(self, scenario: str, planned: int, blocks: int, need: int, least: int) -> None:
        self.scenario, self.planned, self.blocks, self.need = scenario, planned, blocks, need
        super().__init__(
            f"scenario {scenario!r}: {planned} planned requests per engine make {blocks} "
            f"time blocks; the paired checks need at least {least} to decide anything: "
            f"raise its requests (or duration) to about {need} per engine, or set "
            "policy.short_scenarios: allow to run it with its latency undecided"
        )


class DocumentUnreadable(GateError):
    """A stored verdict document that this version's model cannot read (written by another
    version, or edited by hand): the message names the first fields that do not fit."""

    status_code = 500
    code = "document_unreadable"


class LeaseLost(GateError):
    """The gate's reservation lease was lost while it ran (it could not be renewed in time,
    or it was ended elsewhere): the gate stopped its engines before the GPUs could go to
    anyone else."""

    status_code = 409
    code = "lease_lost"


class DatabaseWaited(GateError):
    """A reaper pass waited this long for the database (a write lock held elsewhere, a
    restart): it ended nobody, since the gates' heartbeats waited just as long."""

    status_code = 503
    code = "database_waited"

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"waited {waited_s:.1f} s for the database")
        self.waited_s = waited_s


def transient(exc: BaseException) -> bool:
    """A failure that waiting can cure: the database unreachable, restarting, locked, timed
    out. Anything else (a row the schema refuses, a constraint) is not."""
    from sqlalchemy import exc as sa

    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc, sa.OperationalError | sa.InterfaceError | sa.TimeoutError | OSError | TimeoutError
    )


class TelemetryError(GateError):
    """A telemetry source could not be read this tick (gate/telemetry): an engine's metrics, or
    a GPU tool (nvidia-smi, NVML, a DCGM exporter) that answered nothing usable, the message
    naming the tool and what did not fit. The sampler records a gap in the timeline and
    carries on; it never ends a gate."""
