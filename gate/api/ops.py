"""Capacity, reservations and inventory (`/v1`), and Prometheus `/metrics` (a read token, as
Prometheus sends it with `authorization: {credentials: <token>}`, unless GATE_OPEN_METRICS)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from pydantic import BaseModel

from gate.api.documents import CapacityDoc, InventoryDoc
from gate.api.gates import ERRORS
from gate.core.clock import Timestamp
from gate.core.errors import FieldProblem, SpecError
from gate.http.deps import Ctx, CtxDep, ReadDep, get_ctx, require
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import Inventory, load_inventory
from gate.reservations.leases import held_gpus, list_reservations
from gate.reservations.report import capacity_document, parse_shape
from gate.service import series, service
from gate.service.series import METRICS_WINDOW, GateSeries

router = APIRouter(tags=["capacity"])
metrics_router = APIRouter(include_in_schema=False)


def _inventory(ctx: Ctx) -> Inventory:
    return load_inventory(ctx.settings.inventory)


def _held(ctx: Ctx, inventory: str) -> list[tuple[str, int]]:
    return held_gpus(ctx.factory, inventory)


@router.get(
    "/capacity",
    responses={200: {"model": CapacityDoc}, **ERRORS},
    summary="How many gate shapes fit now, per domain",
)
def capacity(
    ctx: CtxDep,
    _: ReadDep,
    shape: Annotated[
        str,
        Query(
            max_length=1000,
            description="key=value pairs, e.g. sku=H200,gpus_per_engine=8, or worker groups "
            "groups=prefill:4+decode:8x2@clique,connect=prefill/decode@clique (as `gate "
            "capacity --shape`; in a URL, `+` is sent as %2B)",
        ),
    ] = "",
) -> dict[str, Any]:
    try:
        request = ShapeRequest(**parse_shape(shape))
    except (ValueError, TypeError) as exc:
        raise SpecError([FieldProblem("shape", str(exc))], "query") from None
    inv = _inventory(ctx)
    t0 = time.perf_counter()
    doc = capacity_document(inv, request, _held(ctx, inv.name), 0.0)
    doc["elapsed_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    return doc


class ReservationView(BaseModel):
    id: int
    gate_id: str | None
    holder: str
    state: str
    inventory: str
    placement: dict[str, Any]
    created_at: Timestamp
    expires_at: Timestamp
    released_at: Timestamp | None
    release_reason: str | None


@router.get(
    "/reservations",
    response_model=list[ReservationView],
    responses=ERRORS,
    summary="GPU reservations, newest first",
)
def reservations(
    ctx: CtxDep,
    _: ReadDep,
    active: bool = True,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[ReservationView]:
    return [
        ReservationView(**row) for row in list_reservations(ctx.factory, active=active, limit=limit)
    ]


@router.get(
    "/inventory",
    responses={200: {"model": InventoryDoc}, **ERRORS},
    summary="The GPU inventory and what gates hold",
)
def inventory(ctx: CtxDep, _: ReadDep) -> dict[str, Any]:
    inv = _inventory(ctx)
    held: dict[str, int] = {}
    for node, _gpu in _held(ctx, inv.name):
        held[node] = held.get(node, 0) + 1
    return {
        "name": inv.name,
        "nodes": [
            {**n.model_dump(mode="json"), "held_by_gates": held.get(n.name, 0)} for n in inv.nodes
        ],
        "gpus": sum(n.gpus for n in inv.nodes),
        "held_by_gates": sum(held.values()),
    }


PHASE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


def phase_durations(
    rows: Iterable[tuple[str, str, str, float]],
) -> dict[tuple[str, str], list[float]]:
    """Seconds spent in each phase, by (role, phase), from phase rows `(gate_id, role, phase,
    at_s)` sorted by gate, role and `at_s` (`service.service_counts`): a phase lasts from its
    own `at_s` to the `at_s` of the next row of the same gate and role, so a phase with no
    next row (the last one, or the one a running gate is in now) has no duration yet. All
    `scenario:NAME` phases are one label, `scenario`: scenario names are the specs', not
    bounded."""
    durations: dict[tuple[str, str], list[float]] = {}
    prev: tuple[str, str, str, float] | None = None
    for gate_id, role, phase, at in rows:
        if prev is not None and prev[0] == gate_id and prev[1] == role:
            name = "scenario" if prev[2].startswith("scenario:") else prev[2]
            durations.setdefault((role, name), []).append(max(0.0, at - prev[3]))
        prev = (gate_id, role, phase, at)
    return durations


RATIO_BUCKETS = (0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.5, 2.0, 5.0)
GATE_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


def _buckets(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = [(str(b), sum(1 for v in values if v <= b)) for b in bounds]
    return [*out, ("+Inf", len(values))]


def gate_families(g: GateSeries) -> Iterator[Any]:
    """The per-check and per-gate series (gate/service/series.py bounds their labels)."""
    finished = CounterMetricFamily(
        "gate_finished_gates",
        "Finished gates by spec, verdict and A/A (both engines specified alike), all time",
        labels=["spec", "verdict", "aa"],
    )
    for (spec, verdict, aa), n in sorted(g.finished.items()):
        finished.add_metric([spec, verdict, aa], n)
    yield finished
    ratios: dict[tuple[str, str, str], list[float]] = {}
    decisions: Counter[tuple[str, str, str]] = Counter()
    last: dict[tuple[str, str], float] = {}
    for c in g.checks:  # newest gate first
        decisions[(c.spec, c.check, c.decision)] += 1
        if c.ratio is not None:
            ratios.setdefault((c.spec, c.check, c.verdict), []).append(c.ratio)
            last.setdefault((c.spec, c.check), c.ratio)
    hist = GaugeHistogramMetricFamily(
        "gate_check_ratio",
        f"Candidate/reference ratio of each check in the last {METRICS_WINDOW} finished gates, "
        "by spec, check (its id without the scenario) and the gate's verdict",
        labels=["spec", "check", "verdict"],
    )
    for key, values in sorted(ratios.items()):
        hist.add_metric(list(key), _buckets(values, RATIO_BUCKETS), sum(values))
    yield hist
    yield _gauge(
        "gate_check_ratio_last",
        "The ratio of each check in the newest finished gate of each spec",
        ["spec", "check"],
        last,
    )
    yield _gauge(
        "gate_checks",
        f"Checks in the last {METRICS_WINDOW} finished gates by spec, check and decision",
        ["spec", "check", "decision"],
        decisions,
    )
    durations: dict[tuple[str, str], list[float]] = {}
    for spec, verdict, seconds in g.durations:
        durations.setdefault((spec, verdict), []).append(seconds)
    dur = GaugeHistogramMetricFamily(
        "gate_duration_seconds",
        f"Start to finish of the last {METRICS_WINDOW} finished gates, by spec and verdict "
        "(each stage's share: gate_phase_seconds)",
        labels=["spec", "verdict"],
    )
    for (spec, verdict), taken in sorted(durations.items()):
        dur.add_metric([spec, verdict], _buckets(taken, GATE_BUCKETS), sum(taken))
    yield dur
    yield _gauge(
        "gate_oldest_active_seconds",
        "Seconds since the oldest pending gate was created and the oldest running one "
        "started (0: none)",
        ["state"],
        {(state,): age for state, age in g.oldest_active_s.items()},
    )


def _gauge(name: str, doc: str, labels: list[str], values: Mapping[Any, float]) -> Any:
    fam = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        fam.add_metric(list(key), value)
    return fam


class ServiceCollector(Collector):
    """Read at scrape time from the database, so every API replica reports the same truth."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Any]:
        ctx = self.ctx
        gates = GaugeMetricFamily(
            "gate_gates", "Gates by state and verdict", labels=["state", "verdict"]
        )
        phases = HistogramMetricFamily(
            "gate_engine_phase_seconds",
            "Seconds an engine spent in each lifecycle phase: from the phase's row to that "
            "engine's next one (launched: until its process was up; model_listed: its warm-up; "
            "ready: serving the scenarios until stopped). The last phase (stopped, crashed) "
            "and the one an engine is in now are not counted.",
            labels=["role", "phase"],
        )
        gate_phases = HistogramMetricFamily(
            "gate_phase_seconds",
            "Seconds a gate spent in each of its phases: from the phase's row to the gate's "
            "next one (requested: until it reserved or began to wait for capacity; "
            "waiting_for_capacity; reserved: the engines' launch and warm-up; capabilities: the "
            "asks of what each engine supports; scenario: each "
            "scenario, one label for all; judging: the judgment and teardown). Not the time "
            "since the gate started: the last phase (released) and the one a gate is in now "
            "are not counted.",
            labels=["phase"],
        )
        db = service.service_counts(ctx.factory)
        for state, verdict, n in db.gates:
            gates.add_metric([state, verdict or ""], n)
        active, held, rows = db.active_reservations, db.gpus_held, db.phases
        yield gates
        for (role, phase), values in sorted(phase_durations(rows).items()):
            counts = [sum(1 for v in values if v <= b) for b in PHASE_BUCKETS]
            buckets = [(str(b), c) for b, c in zip(PHASE_BUCKETS, counts, strict=True)]
            buckets.append(("+Inf", len(values)))
            if role == "gate":
                gate_phases.add_metric([phase], buckets, sum(values))
            else:
                phases.add_metric([role, phase], buckets, sum(values))
        yield phases
        yield gate_phases
        yield GaugeMetricFamily("gate_reservations_active", "Active GPU reservations", active or 0)
        yield GaugeMetricFamily("gate_gpus_held", "GPUs held by gate reservations", held or 0)
        yield from gate_families(series.gate_series(ctx.factory))
        depth = ctx.dispatcher.queue_depth()
        if depth is not None:
            yield GaugeMetricFamily("gate_queue_depth", "Gates waiting for a worker", depth)
        try:
            inv = load_inventory(ctx.settings.inventory)
            total = sum(n.gpus - n.allocated_gpus for n in inv.nodes if n.healthy)
            yield GaugeMetricFamily(
                "gate_capacity_gpus",
                "GPUs of healthy inventory nodes not used by other workloads",
                total,
            )
            yield GaugeMetricFamily(
                "gate_capacity_free_gpus", "Of those, not held by gates", total - (held or 0)
            )
        except SpecError:
            pass


_read = require("read")


async def _metrics_access(request: Request) -> None:
    """What the gates' counts, queue and capacity tell is a read: it needs the read scope,
    unless the operator opened /metrics (GATE_OPEN_METRICS) or every read."""
    if not get_ctx(request).settings.open_metrics:
        await _read(request)


@metrics_router.get("/metrics", dependencies=[Depends(_metrics_access)])
def metrics(ctx: CtxDep) -> Response:
    registry = CollectorRegistry()
    registry.register(ServiceCollector(ctx))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
