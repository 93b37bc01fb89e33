"""API probes: what the reference answers well, the candidate must answer compatibly."""

from __future__ import annotations

from gate.analysis.compat import ProbePair, ProbeResult, compatibility_checks

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
