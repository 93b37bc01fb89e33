"""The verdict document: the one typed contract every reader of a gate gets (document.py), the
three ways one is made (build.py), and the verdict in words every surface says (summary.py)."""

from gate.verdict.build import (
    Evidence,
    Header,
    check_doc,
    ended_document,
    gate_document,
    invalid_spec_document,
)
from gate.verdict.document import CheckDoc, RejudgeResult, VerdictDocument

__all__ = [
    "CheckDoc",
    "Evidence",
    "Header",
    "RejudgeResult",
    "VerdictDocument",
    "check_doc",
    "ended_document",
    "gate_document",
    "invalid_spec_document",
]
