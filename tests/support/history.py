"""A spec's history for the tests: earlier gates stored through the run's own write path
(`rows.start_run`, `rows.finish_run`), each a copy of a real gate's verdict document with its
reference's figures and its checks' ratios moved a little, on alternating hosts. The copies are
what a long history of short real runs would have stored, made in milliseconds."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.history import compare_reference
from gate.runs import rows
from gate.spec import GateSpec
from gate.verdict.document import DistributionDoc, RunSummaryDoc, ScenarioDoc, VerdictDocument
from gate.verdict.history import comparison_doc, reference_figures

HOSTS = ("node-a", "node-b")


def _scaled(d: DistributionDoc | None, k: float) -> DistributionDoc | None:
    if d is None:
        return None
    return d.model_copy(
        update={q: getattr(d, q) * k for q in ("mean", "p50", "p90", "p99") if getattr(d, q)}
    )


def _reference(s: ScenarioDoc, ttft: float, itl: float) -> ScenarioDoc:
    ref: RunSummaryDoc = s.reference
    moved = ref.model_copy(
        update={"ttft_ms": _scaled(ref.ttft_ms, ttft), "itl_ms": _scaled(ref.itl_ms, itl)}
    )
    return s.model_copy(update={"reference": moved})


def jitter(i: int, host: str) -> float:
    """A deterministic wobble: +-3% on node-a, +-8% on node-b (the noisier host)."""
    return 1 + (0.03 if host == HOSTS[0] else 0.08) * math.sin(1.7 * i + 0.3)


def copy_of(
    doc: VerdictDocument, i: int, finished: datetime, drift: float = 1.0
) -> VerdictDocument:
    """Gate `i` of the history: `doc` with a new id, host, finish time and moved figures (its
    reference's TTFT also times `drift`)."""
    assert doc.testbed is not None and doc.scenarios is not None
    host = HOSTS[i % len(HOSTS)]
    k = jitter(i, host)
    checks = [
        c.model_copy(update={"ratio": c.ratio * (1 + 0.02 * math.cos(i))}) if c.ratio else c
        for c in doc.checks
    ]
    return doc.model_copy(
        update={
            "gate_id": uuid.uuid4().hex,
            "finished_at": finished.isoformat().replace("+00:00", "Z"),
            "scenarios": [_reference(s, k * drift, 2 - k) for s in doc.scenarios],
            "checks": checks,
            "testbed": doc.testbed.model_copy(update={"host": host}),
            "history": None,
        }
    )


def seed_history(
    factory: sessionmaker[Session],
    spec: GateSpec,
    doc: VerdictDocument,
    n: int,
    drift: Callable[[int], float] = lambda i: 1.0,
) -> list[str]:
    """`n` earlier gates of `spec`'s identity, an hour apart, the newest an hour ago; gate
    `i`'s reference TTFT moved by `drift(i)`, and each compared with the ones before it as a
    run compares itself (gate/analysis/history.py), so a drift is flagged where a run would."""
    now = datetime.now(UTC)
    ids: list[str] = []
    past: list[dict[str, float]] = []  # newest first
    for i in range(n):
        finished = now - timedelta(hours=n - i)
        copy = copy_of(doc, i, finished, drift(i))
        figures = reference_figures(copy.scenarios or [])
        copy = copy.model_copy(update={"history": comparison_doc(compare_reference(figures, past))})
        past.insert(0, figures)
        assert copy.gate_id is not None
        rows.start_run(factory, copy.gate_id, spec, started=finished, worker=None)
        rows.finish_run(factory, copy, [], [], finished=finished)
        ids.append(copy.gate_id)
    return ids
