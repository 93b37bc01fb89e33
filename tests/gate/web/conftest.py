"""Gates for the page tests: finished ones written straight into the database (a verdict
document and per-request columns, with engine output that tries to run script), and
pending/running rows whose state, phase and progress a test moves along."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.samples import Columns, columns_from_records
from gate.api.app import create_app
from gate.core.database import transaction
from gate.core.settings import Settings
from gate.models import GatePhase, GateRun, SampleSet
from loadgen.records import RequestRecord

# Engine-produced text that would run script if it reached the page as markup.
SCRIPT = "<script>window.__pwned = 1; alert('pwned')</script>"
IMG = '<img src=x onerror="window.__pwned = 2; alert(2)">'
EVIL = f"{SCRIPT}{IMG}"


def records(
    n: int, ttft_ms: float, *, errors_every: int = 0, text: str = ""
) -> list[RequestRecord]:
    """n requests 50 ms apart, 8 tokens each 12 ms apart; every `errors_every`-th one a 5xx."""
    out = []
    for i in range(n):
        sent = i * 50_000_000
        if errors_every and i % errors_every == errors_every - 1:
            out.append(
                RequestRecord(i, "x", sent, sent, None, sent + 5_000_000, 503, "http_5xx", EVIL, 0)
            )
            continue
        first = sent + int(ttft_ms * 1e6 * (1 + 0.02 * (i % 11)))
        chunks = [first + j * 12_000_000 for j in range(8)]
        out.append(
            RequestRecord(
                i, "x", sent, sent, first, chunks[-1], 200, None, None, 8, 16, chunks, [1] * 8, text
            )
        )
    return out


def summary(ttft: float) -> dict[str, Any]:
    dist = {"mean": ttft, "p50": ttft, "p90": ttft * 1.1, "p99": ttft * 1.3}
    return {
        "requests": {"sent": 80, "ok": 76, "errors": 4},
        "errors_by_kind": {"http_5xx": 4},
        "ttft_ms": dist,
        "itl_ms": {"mean": 12.0, "p50": 12.0, "p90": 12.5, "p99": 13.0},
        "e2e_ms": {"mean": 140.0, "p50": 140.0, "p90": 150.0, "p99": 170.0},
        "throughput": {"requests_per_s": 19.0, "output_tokens_per_s": 152.0},
    }


def evil_document(gate_id: str, name: str = "xss-probe") -> dict[str, Any]:
    """A hold whose every engine-produced string carries script."""
    return {
        "gate_id": gate_id,
        "name": name,
        "model": "demo-model",
        "state": "complete",
        "verdict": "hold",
        "reasons": [{"check": "steady.ttft.p50", "message": f"TTFT regressed {EVIL}"}],
        "checks": [
            {
                "id": "steady.ttft.p50",
                "group": "latency",
                "scenario": "steady",
                "metric": "ttft",
                "quantile": 0.5,
                "reference": 40.0,
                "candidate": 60.0,
                "ratio": 1.5,
                "interval": [1.4, 1.6],
                "estimate_interval": [1.45, 1.55],
                "threshold": 1.05,
                "decision": "fail",
                "samples": [72, 72],
                "alpha": 0.005,
                "message": f"TTFT is 1.5x {EVIL}",
            },
            {
                "id": "compat.tool_call",
                "group": "compatibility",
                "scenario": None,
                "metric": "probe",
                "quantile": None,
                "reference": 200.0,
                "candidate": 500.0,
                "ratio": None,
                "interval": None,
                "threshold": None,
                "decision": "fail",
                "samples": [1, 1],
                "alpha": None,
                "message": f"Probe tool_call: {EVIL}",
            },
        ],
        "notes": [f"a note {EVIL}"],
        "report": "/nowhere/r.html",
        "document": "/nowhere/r.json",
        "error": None,
        "engines": {
            "reference": {
                "kind": "process",
                "url": "http://127.0.0.1:1",
                "placement": {"node": "local-h200-0", "gpus": [0], "sku": "H200"},
                "phases": {"launched": 0.1, "port_open": 0.6, "healthy": 0.8, "ready": 1.5},
                "ready_s": 1.4,
                "crash": None,
                "log": None,
                "log_tail": ["sim: ready", f"log line {SCRIPT}", f"another {IMG}"],
            },
            "candidate": {
                "kind": "process",
                "url": "http://127.0.0.1:2",
                "placement": {"node": "local-h200-0", "gpus": [1], "sku": "H200"},
                "phases": {"launched": 0.1, "port_open": 0.7, "healthy": 0.9, "ready": 1.6},
                "ready_s": 1.5,
                "crash": {
                    "at_s": 9.0,
                    "exit_code": 1,
                    "description": f"exited with status 1 {EVIL}",
                    "log_tail": [EVIL],
                },
                "log": None,
                "log_tail": [f"Traceback {EVIL}"],
            },
        },
        "scenarios": [
            {
                "name": "steady",
                "duration_s": 4.0,
                "aborted": False,
                "phases": [
                    {"name": "warm", "start_s": 0.0},
                    {"name": f"hot {IMG}", "start_s": 2.0},
                ],
                "reference": summary(40.0),
                "candidate": summary(60.0),
            }
        ],
        "probes": [
            {
                "name": "tool_call",
                "reference": {"status": 200, "ok": True, "problems": []},
                "candidate": {"status": 500, "ok": False, "problems": [f"body was {EVIL}"]},
            }
        ],
        "divergence_examples": [
            {
                "prompt": f"Say hello {SCRIPT}",
                "reference_tokens": ["Hello", ",", " world", "!", " <b>"],
                "candidate_tokens": ["Hello", ",", SCRIPT, IMG, " </pre>"],
                "index": 2,
                "margin": 0.0123,
            }
        ],
        "started_at": "2026-11-30T10:00:00+00:00",
        "finished_at": "2026-11-30T10:00:12+00:00",
        "duration_s": 12.0,
        "exit_code": 1,
    }


def evil_columns() -> dict[str, dict[str, Columns]]:
    return {
        "steady": {
            "reference": columns_from_records(records(80, 40, text=EVIL), 0),
            "candidate": columns_from_records(records(80, 60, errors_every=20, text=EVIL), 0),
        }
    }


class Seed:
    """Writes gates the way the runner leaves them, without running engines."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def finished(
        self,
        document: dict[str, Any] | None = None,
        columns: dict[str, dict[str, Columns]] | None = None,
        *,
        name: str = "finished",
        verdict: str = "hold",
        state: str = "complete",
        candidate: str = "vllm:0.6.4",
        reference: str = "vllm:0.6.3",
        created_at: datetime | None = None,
        spec: dict[str, Any] | None = None,
    ) -> str:
        gate_id = uuid.uuid4().hex
        doc = document if document is not None else evil_document(gate_id, name)
        doc = {**doc, "gate_id": gate_id}
        at = created_at or datetime.now(UTC)
        with transaction(self.factory) as s:
            s.add(
                GateRun(
                    id=gate_id,
                    name=name,
                    spec=spec or {"policy": {"warmup_requests": 4}},
                    state=state,
                    phase="finished",
                    verdict=verdict,
                    reason="; ".join(r["message"] for r in doc.get("reasons", [])) or None,
                    document=doc,
                    created_at=at,
                    started_at=at,
                    finished_at=at + timedelta(seconds=12),
                    source="api",
                    reference_label=reference,
                    candidate_label=candidate,
                    attempts=1,
                    cancel_requested=False,
                )
            )
            for scenario, by_role in (columns or {}).items():
                for role, cols in by_role.items():
                    s.add(
                        SampleSet(
                            gate_id=gate_id,
                            scenario=scenario,
                            role=role,
                            requests=len(cols),
                            columns=cols.to_bytes(),
                        )
                    )
        return gate_id

    def live(
        self,
        *,
        name: str = "live",
        state: str = "running",
        phase: str = "scenario:steady",
        progress: dict[str, Any] | None = None,
        candidate: str = "vllm:0.6.4",
        created_at: datetime | None = None,
    ) -> str:
        gate_id = uuid.uuid4().hex
        at = created_at or datetime.now(UTC)
        with transaction(self.factory) as s:
            s.add(
                GateRun(
                    id=gate_id,
                    name=name,
                    spec={},
                    state=state,
                    phase=phase,
                    created_at=at,
                    started_at=at if state == "running" else None,
                    heartbeat_at=at if state == "running" else None,
                    source="api",
                    reference_label="vllm:0.6.3",
                    candidate_label=candidate,
                    progress=progress,
                    worker="inproc@test:1" if state == "running" else None,
                    attempts=1 if state == "running" else 0,
                    cancel_requested=False,
                )
            )
        return gate_id

    def phase(self, gate_id: str, role: str, phase: str, at_s: float, detail: str) -> None:
        with transaction(self.factory) as s:
            s.add(GatePhase(gate_id=gate_id, role=role, phase=phase, at_s=at_s, detail=detail))

    def update(self, gate_id: str, **fields: Any) -> None:
        with transaction(self.factory) as s:
            run = s.get(GateRun, gate_id)
            assert run is not None
            for k, v in fields.items():
                setattr(run, k, v)


@pytest.fixture
def web_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / ".gate", open_reads=True, lost_after_s=3600)


@pytest.fixture
def web_app(web_settings: Settings) -> FastAPI:
    return create_app(web_settings, start_workers=False)


@pytest.fixture
def seed(web_app: FastAPI) -> Seed:
    return Seed(web_app.state.ctx.factory)


@pytest.fixture(scope="session")
def wt() -> Any:
    """This module (payloads and builders) for the tests: importlib mode cannot import a
    conftest by name."""
    import sys

    return sys.modules[__name__]
