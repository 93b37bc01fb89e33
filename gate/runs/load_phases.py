"""The load phases of peak and overload scenarios: each engine's requests as the load
checks read them, on the requests both engines finished."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gate.analysis.load import OverloadPhase, PeakPhase, RequestLog, Slo
from gate.analysis.samples import (
    ERROR_KINDS,
    Columns,
    take_requests,
)
from loadgen import suite as catalogue


def request_log(cols: Columns) -> RequestLog:
    """One engine's requests as the load checks read them; send times are the schedule's
    (identical on both arms), so windows cut both engines at the same requests."""
    ok = cols.ok
    sent = cols.sent_ns.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ttft = np.where(ok & (cols.first_token_ns >= 0), (cols.first_token_ns - sent) / 1e6, np.nan)
        e2e = np.where(cols.end_ns >= 0, (cols.end_ns - sent) / 1e6, np.nan)
    return RequestLog(
        sent_s=cols.intended_ns / 1e9,
        ttft_ms=ttft,
        itl_ms=np.where(ok, cols.itl_mean_ns / 1e6, np.nan),
        e2e_ms=e2e,
        status=cols.status,
        error=tuple(None if e < 0 else ERROR_KINDS[int(e)] for e in cols.error),
    )


def _paired(reference: Columns, candidate: Columns) -> tuple[Columns, Columns]:
    """Both arms cut to the requests both have (a stopped run may miss some on one side)."""
    common = np.intersect1d(reference.request_id, candidate.request_id)
    out = []
    for cols in (reference, candidate):
        out.append(_subset(cols, np.isin(cols.request_id, common)))
    return out[0], out[1]


def _subset(cols: Columns, keep: np.ndarray) -> Columns:
    return cols if bool(keep.all()) else take_requests(cols, keep)


def load_phases(
    name: str,
    suite: str | None,
    settings: Mapping[str, Any],
    reference: Columns,
    candidate: Columns,
    marks: Sequence[tuple[str, float]],
) -> tuple[list[PeakPhase], list[OverloadPhase]]:
    """The peak or overload phase of a suite scenario (warm-up already dropped), else none.

    peak: the whole scenario, goodput under the suite's SLOs. overload and recovery: the
    overload window from the schedule's phases; a ramp into it is left out (neither the level
    before the overload nor the overload itself).
    """
    if suite not in ("peak", "overload", "recovery"):
        return [], []
    ref, cand = _paired(reference, candidate)
    if suite == "peak":
        cfg = catalogue.get("peak", **settings)
        assert isinstance(cfg, catalogue.Peak)
        slo = Slo(ttft_ms=cfg.slo_ttft_ms, itl_ms=cfg.slo_itl_ms, e2e_ms=cfg.slo_e2e_ms)
        return [PeakPhase(name, request_log(ref), request_log(cand), slo)], []
    cfg_o = catalogue.get(suite, **settings)
    assert isinstance(cfg_o, catalogue.Overload)
    names = [n for n, _ in marks]
    if "overload" not in names:
        return [], []
    i = names.index("overload")
    start = marks[i][1]
    end = start + cfg_o.overload_s
    if "ramp" in names:
        ramp = names.index("ramp")
        ref = _subset(ref, ref.phase != ramp)
        cand = _subset(cand, cand.phase != ramp)
    return [], [OverloadPhase(name, request_log(ref), request_log(cand), start, end)]
