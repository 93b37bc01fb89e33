"""The report's correctness evidence: divergence examples with a token window around the first
difference, the correctness runs with their teacher-forced |delta logprob| chart, the mirrored
outputs of load scenarios, and the compatibility probes, failures first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from markupsafe import Markup

from gate.reports.charts import cdf_chart
from gate.verdict.document import AbsDeltaDoc, Answered, VerdictDocument


def divergences(doc: VerdictDocument) -> list[dict[str, Any]]:
    """Divergence examples, each with a token window around the first divergence; the index
    is computed when the document does not give it."""
    out = []
    for ex in doc.divergence_examples or []:
        ref, cand = ex.reference_tokens, ex.candidate_tokens
        index = ex.index
        if index is None or index < 0:
            index = next(
                (i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b),
                min(len(ref), len(cand)),
            )
        start = max(0, index - 24)

        def window(tokens: list[str], index: int = index, start: int = start) -> list[Any]:
            return [
                (t, "div" if i == index else "after" if i > index else "same")
                for i, t in enumerate(tokens[start : index + 12], start=start)
            ]

        out.append(
            {
                "scenario": ex.scenario,
                "prompt": ex.prompt,
                "index": index,
                "margin": f"{ex.margin:.4g}" if ex.margin is not None else None,
                "skipped": start,
                "reference": window(ref),
                "candidate": window(cand),
                "more": max(len(ref), len(cand)) > index + 12,
                "outside_top_k": bool(ex.outside_top_k),
            }
        )
    return out


def _answered(a: Answered) -> str:
    """Each count the document gives: the reference's, the candidate's, the reference's
    under load (absent from documents of older gates)."""
    counts = [(name, getattr(a, name)) for name in type(a).model_fields]
    return ", ".join(
        f"{name.replace('_', ' ')} {v}" for name, v in counts if name in a.model_fields_set
    )


def correctness_runs(doc: VerdictDocument) -> list[dict[str, Any]]:
    return [
        {
            "name": run.name,
            "probes": run.probes,
            "answered": _answered(run.answered),
            "exact": run.exact_matches,
            "envelope": run.envelope_exact_matches,
            "teacher": run.teacher_forced,
            "failures": [(f.engine, f.message) for f in run.failures],
            "probes_detail": run.probe_divergence,
            "delta_chart": _delta_chart(run.abs_delta_logprob),
        }
        for run in doc.correctness or []
    ]


def _median_bin(hist: Sequence[int]) -> int | None:
    n, seen = sum(hist), 0
    for i, count in enumerate(hist):
        seen += count
        if n and 2 * seen >= n:
            return i
    return None


def mirrored_outputs(doc: VerdictDocument) -> list[dict[str, Any]]:
    """Each load scenario's mirrored outputs, as compared (temperature 0 only)."""
    return [
        {
            "scenario": sc.name,
            "compared": o.compared,
            "exact": o.exact,
            "early": o.early,
            "early_tokens": o.early_tokens,
            "median": _median_bin(o.histogram),
            "basis": "token ids" if o.basis == "token_ids" else "text",
            "examples": o.examples,
        }
        for sc in doc.scenarios or []
        if (o := sc.outputs) is not None
    ]


def _delta_chart(delta: AbsDeltaDoc | None) -> Markup | None:
    """Teacher-forced |delta logprob| per position, the candidate's against the reference's
    own, with the floor and the envelope's reach marked."""
    if delta is None:
        return None
    cand = np.asarray(delta.candidate, dtype=np.float64)
    env = np.asarray(delta.envelope, dtype=np.float64)
    if not cand.size and not env.size:
        return None
    floor = float(delta.floor_nat or 0.0)
    scale = 1.0 + float(delta.envelope_tolerance or 0.0)
    marks = [(f"floor {floor:g}", floor)]
    if env.size and float(np.max(env)) > 0:
        reach = scale * float(np.quantile(env, 0.99)) + floor
        # A guide for the eye: the checks test per-prompt means (Mann-Whitney), not positions.
        marks.append((f"envelope p99 x{scale:g} + floor {reach:.3g} (a guide)", reach))
    return Markup(
        cdf_chart(
            {"reference vs candidate": cand, "reference vs itself": env},
            "Teacher-forced |delta logprob| per position",
            "nat",
            quantiles=(0.5, 0.99),
            verticals=marks,
            what="positions",
        )
    )


def probe_rows(doc: VerdictDocument) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in doc.probes or []:
        ref, cand = p.reference, p.candidate
        if ref.ok and not cand.ok:
            outcome = "fail"
        elif not ref.ok:
            outcome = "not judged"
        else:
            outcome = "pass"
        out.append(
            {
                "name": p.name,
                "outcome": outcome,
                "sides": [
                    (role, side.status, side.ok, list(side.problems))
                    for role, side in (("reference", ref), ("candidate", cand))
                ],
            }
        )
    rank = {"fail": 0, "not judged": 1}
    out.sort(key=lambda r: rank.get(str(r["outcome"]), 2))
    return out
