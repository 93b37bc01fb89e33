"""The telemetry stage of a load scenario: which sources each engine role is read from, the
sampler started beside the load and stopped after it, and its timelines as the document
stores them (`TelemetryDoc`, which re-judge reads back).

A role's sources: the engine's Prometheus endpoint (`EngineSpec.metrics_path` on its URL;
none when the spec says null) and its reserved GPUs (gate/telemetry/gpu_sources.py: NVML,
nvidia-smi or the DCGM exporter, chosen once per gate by `Engines.gpu_sources`), so both land
in the same timelines on the same clock; why a role's GPUs are not read is the document's
`TelemetryDoc.gpu_note`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from gate.core.vocabulary import ROLES
from gate.runs.context import RunContext
from gate.runs.engine_pair import Engines
from gate.telemetry import PrometheusSource, Sampler, Source, Timeline
from gate.telemetry.gpu_sources import EngineGpuSource
from gate.verdict.document import EngineTelemetryDoc, TelemetryDoc

__all__ = ["role_sources", "start_sampler", "telemetry_doc"]


def role_sources(ctx: RunContext, engines: Engines) -> dict[str, list[Source]]:
    """Each role's sources (an empty list: nothing to read, which the judge notes)."""
    out: dict[str, list[Source]] = {}
    for role in ROLES:
        es = ctx.spec.engine(role)
        eng = engines.built.get(role)
        srcs: list[Source] = []
        if es.metrics_path is not None and eng is not None:
            url = eng.base_url.rstrip("/") + es.metrics_path
            srcs.append(PrometheusSource(url, url, timeout_s=ctx.spec.telemetry.timeout_s))
        gpus = engines.gpu_sources().sources.get(role)
        if gpus is not None:
            srcs.append(EngineGpuSource(gpus))
        out[role] = srcs
    return out


def start_sampler(ctx: RunContext, engines: Engines) -> Sampler | None:
    """The sampler of one scenario, started (None: telemetry is off in the spec)."""
    spec = ctx.spec.telemetry
    if not spec.enabled:
        return None
    sampler = Sampler(
        role_sources(ctx, engines), interval_s=spec.interval_s, zero_ns=time.monotonic_ns()
    )
    sampler.start()
    return sampler


def _engine_doc(tl: Timeline | None) -> EngineTelemetryDoc | None:
    if tl is None or not tl.sources:
        return None
    return EngineTelemetryDoc(
        sources=tl.sources,
        t_s=tl.t_s,
        series=tl.series,
        config=tl.config,
        gaps=tl.gaps,
        notes=tl.notes,
    )


def telemetry_doc(
    interval_s: float, timelines: Mapping[str, Timeline], gpu_notes: Sequence[str] = ()
) -> TelemetryDoc:
    return TelemetryDoc(
        interval_s=interval_s,
        reference=_engine_doc(timelines.get("reference")),
        candidate=_engine_doc(timelines.get("candidate")),
        gpu_note=" ".join(gpu_notes) or None,
    )
