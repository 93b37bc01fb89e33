"""The verdict document's compatibility probes and correctness scenarios (document.py): how
each engine answered every probe, the greedy probes matched and where they part, the
teacher-forced |delta logprob| against the envelope, and the divergence examples shown."""

from __future__ import annotations

from pydantic import Field

from gate.core.vocabulary import Role
from gate.verdict.document_base import _Doc

__all__ = [
    "AbsDeltaDoc",
    "Answered",
    "CorrectnessDoc",
    "DivergenceExample",
    "EngineFailure",
    "ProbeDivergenceDoc",
    "ProbeDoc",
    "ProbeSide",
]


class ProbeSide(_Doc):
    status: int | None = None
    ok: bool
    problems: list[str] = Field(default_factory=list)


class ProbeDoc(_Doc):
    """One compatibility probe, as each engine answered it."""

    name: str
    reference: ProbeSide
    candidate: ProbeSide


class Answered(_Doc):
    reference: int
    candidate: int
    reference_under_load: int | None = None  # absent from documents of older gates


class EngineFailure(_Doc):
    engine: Role
    message: str


class ProbeDivergenceDoc(_Doc):
    """One greedy probe, reference against candidate, where they first part (None: identical):
    both tokens with the logprob each engine gave its own, the reference's logprob of the
    candidate's token, and the reference's margin there."""

    probe: int
    first: int | None = None
    length: int = 0
    reference_token: str | None = None
    reference_logprob: float | None = None
    candidate_token: str | None = None
    candidate_logprob: float | None = None
    reference_logprob_of_candidate: float | None = Field(
        None, description="None: the candidate's token is outside the reference's top-k"
    )
    margin: float | None = None
    outside_top_k: bool = False


class AbsDeltaDoc(_Doc):
    """Teacher-forced |delta logprob| per position (rounded, at most 4,096 a side): reference
    vs candidate and the reference against itself, with the policy's floor."""

    candidate: list[float] = Field(default_factory=list)
    envelope: list[float] = Field(default_factory=list)
    floor_nat: float
    envelope_tolerance: float


class CorrectnessDoc(_Doc):
    """A correctness scenario: how many greedy probes each engine answered and matched."""

    name: str
    probes: int
    answered: Answered
    exact_matches: int
    envelope_exact_matches: int
    teacher_forced: int
    failures: list[EngineFailure] = Field(default_factory=list)
    probe_divergence: list[ProbeDivergenceDoc] = Field(default_factory=list)
    abs_delta_logprob: AbsDeltaDoc | None = None
    envelope_early: int = Field(
        0, description="envelope pairs that part before early_tokens (the load outputs' bar)"
    )
    envelope_pairs: int = Field(0, description="the reference's free-run pairs against itself")


class DivergenceExample(_Doc):
    """A greedy output where the candidate left the reference: the tokens around it."""

    prompt: str
    reference_tokens: list[str]
    candidate_tokens: list[str]
    index: int | None = Field(None, description="the first token that differs")
    margin: float | None = None
    outside_top_k: bool | None = None
    scenario: str | None = None
