"""API probes: what the reference answers well, the candidate must answer compatibly."""

from __future__ import annotations

import pytest

from gate.analysis.compat import ProbePair, ProbeResult, capability_checks, compatibility_checks
from gate.analysis.types import Check

KEYS = frozenset({"id", "choices", "choices.text", "usage", "usage.completion_tokens"})
GOOD = ProbeResult(ok=True, status=200, well_formed=True, schema_keys=KEYS)


def one(candidate: ProbeResult, reference: ProbeResult = GOOD) -> tuple[list[str], str]:
    notes: list[str] = []
    checks = compatibility_checks([ProbePair("completions.logprobs", reference, candidate)], notes)
    assert all(c.group == "compatibility" and c.alpha is None for c in checks)
    return [c.decision for c in checks], checks[0].message if checks else " ".join(notes)


def test_same_answer_passes_and_added_keys_are_compatible() -> None:
    assert one(GOOD)[0] == ["pass"]
    decisions, message = one(ProbeResult(True, 200, True, KEYS | {"usage.cached_tokens"}))
    assert decisions == ["pass"]
    assert "adds usage.cached_tokens" in message


def test_error_malformed_or_missing_keys_fail() -> None:
    decisions, message = one(ProbeResult(False, 400, False))
    assert decisions == ["fail"] and "failed with status 400 where the reference got 200" in message
    decisions, message = one(ProbeResult(True, 200, False, KEYS))
    assert decisions == ["fail"] and "malformed" in message
    decisions, message = one(ProbeResult(True, 200, True, KEYS - {"usage.completion_tokens"}))
    assert decisions == ["fail"] and "lacks usage.completion_tokens" in message
    decisions, message = one(ProbeResult(True, 302, True, KEYS))
    assert decisions == ["fail"] and "302 differs" in message


def test_a_probe_the_reference_fails_is_a_note() -> None:
    decisions, note = one(GOOD, reference=ProbeResult(False, 404, False))
    assert decisions == []
    assert "reference itself failed it" in note


# -- capabilities (loadgen/capabilities.py, as the document lists them) ---------------------

ALL = {
    "completions": True,
    "chat": True,
    "logprobs": True,
    "top_logprobs_max": 20,
    "prompt_logprobs": True,
    "token_ids": True,
    "prompt_token_ids": True,
    "stream_usage": True,
}


def by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


def test_a_candidate_with_every_feature_of_the_reference_passes() -> None:
    notes: list[str] = []
    checks = by_id(capability_checks(ALL, ALL, notes))
    assert set(checks) == {f"compat.capability.{f}" for f in ALL}
    assert all(c.decision == "pass" for c in checks.values()) and notes == []


@pytest.mark.parametrize("feature", [f for f in ALL if f != "top_logprobs_max"])
def test_a_feature_the_candidate_lost_fails(feature: str) -> None:
    notes: list[str] = []
    checks = by_id(capability_checks(ALL, ALL | {feature: False}, notes))
    lost = checks[f"compat.capability.{feature}"]
    assert lost.decision == "fail" and lost.holds and "lost" in lost.message
    assert [c.id for c in checks.values() if c.decision == "fail"] == [lost.id]


def test_fewer_top_logprobs_than_the_reference_fail_more_pass() -> None:
    checks = by_id(capability_checks(ALL | {"top_logprobs_max": 5}, ALL, []))
    assert checks["compat.capability.top_logprobs_max"].decision == "pass"
    checks = by_id(capability_checks(ALL, ALL | {"top_logprobs_max": 5}, []))
    assert checks["compat.capability.top_logprobs_max"].decision == "fail"
    checks = by_id(capability_checks(ALL, ALL | {"logprobs": False, "top_logprobs_max": None}, []))
    assert checks["compat.capability.top_logprobs_max"].decision == "fail"


def test_a_feature_the_reference_lacks_is_a_note_never_a_check() -> None:
    # llama.cpp as the reference: no prompt logprobs, no return_token_ids
    ref = ALL | {"prompt_logprobs": False, "prompt_token_ids": False}
    notes: list[str] = []
    checks = by_id(capability_checks(ref, ALL | {"prompt_logprobs": False}, notes))
    assert "compat.capability.prompt_logprobs" not in checks
    assert "compat.capability.prompt_token_ids" not in checks
    assert all(c.decision == "pass" for c in checks.values())
    assert len(notes) == 1 and "prompt logprobs" in notes[0] and "prompt token ids" in notes[0]


def test_unknown_capabilities_judge_nothing() -> None:
    assert capability_checks(None, ALL, []) == [] and capability_checks(ALL, None, []) == []
