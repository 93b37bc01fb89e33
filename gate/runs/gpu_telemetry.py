"""The engines' GPUs in the run: which GPUs each engine holds (from the placement, as the
launchers gave them: gate/engines/launchers.py, groups.py), and each load scenario's GPU series
as the judge reads them (`gpu_scenario`), from the same stored timelines for the live run and
for re-judge (`TelemetryDoc`, whose `gpu_*` series gate/telemetry/gpu_sources.py samples)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from gate.analysis.gpu import GpuScenario, GpuSeries
from gate.analysis.samples import Columns
from gate.core.vocabulary import ROLES
from gate.reservations.allocator import Placement
from gate.spec import GateSpec
from gate.telemetry.gpu_sources import EngineGpus
from gate.verdict.document import EngineTelemetryDoc, TelemetryDoc

__all__ = ["engine_gpus", "gpu_scenario"]


def engine_gpus(spec: GateSpec, placement: Placement | None) -> dict[str, EngineGpus]:
    """Each role's runtime and GPUs: a process engine's are its groups' leader nodes' (what
    CUDA_VISIBLE_DEVICES names), a Kubernetes engine's every node's."""
    out: dict[str, EngineGpus] = {}
    for role in ROLES:
        es = spec.engine(role)
        if placement is None or not es.engine_kind.launched:
            out[role] = EngineGpus(es.runtime)
            continue
        ep = placement.for_role(role)
        if es.runtime == "kubernetes":
            workers = ep.nodes
        elif ep.groups:
            workers = tuple((g.nodes[0], g.gpus[0]) for g in ep.groups)
        else:
            workers = ep.nodes[:1]
        out[role] = EngineGpus(es.runtime, tuple(workers))
    return out


def _values(doc: EngineTelemetryDoc, metric: str) -> tuple[float | None, ...]:
    v = doc.series.get(metric)
    if v is None or len(v) != len(doc.t_s):
        return tuple(None for _ in doc.t_s)
    return tuple(x if x is not None and math.isfinite(x) else None for x in v)


def _series(doc: EngineTelemetryDoc | None, columns: Columns | None) -> GpuSeries | None:
    """An engine's GPU series, or None where its GPUs were not read in this scenario."""
    if doc is None or not any(k == "gpu_memory_used_bytes" for k in doc.series):
        return None
    xids = [x for x in _values(doc, "gpu_xid_errors_total") if x is not None]
    last = [x for x in _values(doc, "gpu_xid_last") if x]
    return GpuSeries(
        t_s=tuple(doc.t_s),
        memory_bytes=_values(doc, "gpu_memory_used_bytes"),
        power_w=_values(doc, "gpu_power_watts"),
        energy_j=_values(doc, "gpu_energy_joules_total"),
        xid_count=int(max(xids)) if xids else 0,
        xid_last=int(last[-1]) if last else None,
        output_tokens=int(columns.output_tokens.sum()) if columns is not None else 0,
    )


def gpu_scenario(
    name: str, doc: TelemetryDoc | None, columns: Mapping[str, Columns]
) -> GpuScenario | None:
    """The judge's view of one scenario's GPUs (None: telemetry was not sampled at all); the
    output tokens are all the scenario's, as its energy spans all of it."""
    if doc is None:
        return None
    return GpuScenario(
        name,
        _series(doc.reference, columns.get("reference")),
        _series(doc.candidate, columns.get("candidate")),
        doc.gpu_note,
    )
