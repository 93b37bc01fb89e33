"""The report's engine cards and lifecycle rows: where each engine ran, when it was ready, what
it answered it supports, its worker groups, its configuration and its log's tail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gate.core.vocabulary import ROLES, Role
from gate.reports.formats import seconds_fine
from gate.reports.telemetry import engine_config
from gate.verdict.document import CapabilitiesDoc, EngineDoc, PlacementDoc, VerdictDocument


def _roles(engines: Mapping[Role, EngineDoc]) -> list[Role]:
    return [r for r in ROLES if r in engines] + [r for r in engines if r not in ROLES]


def _placement(p: PlacementDoc | None) -> str | None:
    if p is None:
        return None
    sku = p.sku if p.sku is not None else "?"  # absent from hand-made documents
    return f"{p.node} · {sku} · GPU " + ",".join(str(g) for g in p.gpus)


def _ready(e: EngineDoc) -> str:
    if e.ready_s is not None:
        return seconds_fine(e.ready_s)
    return "attached (not launched)" if e.kind == "endpoint" else "never ready"


def engine_cards(doc: VerdictDocument) -> list[dict[str, Any]]:
    engines = doc.engines or {}
    return [
        {
            "role": role,
            "kind": e.kind,
            "url": e.url or "–",
            "placement": _placement(e.placement),
            "ready": _ready(e),
            "crash": e.crash,
            "log_tail": list(e.log_tail),
            "log": e.log,
            "capabilities": _capabilities(e.capabilities),
            "groups": _engine_groups(e),
            "config": engine_config(doc.scenarios or [], role),
        }
        for role in _roles(engines)
        for e in (engines[role],)
    ]


def _engine_groups(e: EngineDoc) -> list[dict[str, Any]]:
    """An engine of several worker groups: each group's placement and lifecycle, the router's."""
    placed = {g.role: g for g in (e.placement.groups if e.placement else None) or []}
    out = []
    for g in e.groups or []:
        where = placed.get(g.role)
        nodes = " + ".join(
            f"{n.node} GPU " + ",".join(str(x) for x in n.gpus)
            for n in (where.nodes if where is not None else [])
        )
        state = (
            "crashed"
            if g.crashed
            else f"ready at {seconds_fine(g.phases['model_listed'])}"
            if "model_listed" in g.phases
            else "never ready"
        )
        out.append({"role": g.role, "where": nodes or "no GPUs", "state": state, "pid": g.pid})
    return out


def lifecycles(engines: Mapping[Role, EngineDoc]) -> dict[str, Mapping[str, float]]:
    """The timeline's rows: each engine, then each of its groups (`candidate decode`)."""
    out: dict[str, Mapping[str, float]] = {}
    for role, e in engines.items():
        out[role] = {k: v for k, v in e.phases.items() if "." not in k}
        for g in e.groups or []:
            out[f"{role} {g.role}"] = g.phases
    return out


_CAPABILITY_WORDS = (
    ("completions", "completions"),
    ("chat", "chat"),
    ("logprobs", "logprobs"),
    ("prompt_logprobs", "prompt logprobs"),
    ("token_ids", "token ids"),
    ("prompt_token_ids", "prompt token ids"),
    ("stream_usage", "usage in streams"),
)


def _capabilities(caps: CapabilitiesDoc | None) -> list[tuple[str, bool]] | None:
    """(feature, supported) as the engine answered at readiness; None when not learned."""
    if caps is None:
        return None
    out = []
    for key, words in _CAPABILITY_WORDS:
        if key == "logprobs" and caps.top_logprobs_max is not None:
            words = f"logprobs (top {caps.top_logprobs_max})"
        out.append((words, bool(getattr(caps, key))))
    return out
