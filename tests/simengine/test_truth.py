"""The ground-truth log: its lines parse, and their events are what the client received."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from simengine.launch import SimPool

GREEDY = {"temperature": 0, "ignore_eos": True}
KEYS = {
    "request_id",
    "path",
    "status",
    "arrival_ns",
    "read_ns",
    "events",
    "scheduled_ns",
    "end",
    "end_ns",
}


def _stream(
    client: httpx.Client, path: str, body: dict[str, Any], request_id: str
) -> tuple[list[dict[str, Any]], list[int]]:
    """Content chunks received (role-only and usage-only chunks left out), and when."""
    chunks: list[dict[str, Any]] = []
    stamps: list[int] = []
    headers = {"x-request-id": request_id}
    with client.stream("POST", path, json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["x-request-id"] == request_id
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk["choices"] and chunk["choices"][0].get("delta", {}).get("role"):
                continue
            if not chunk["choices"]:
                continue
            chunks.append(chunk)
            stamps.append(time.monotonic_ns())
    return chunks, stamps


def test_truth_log_matches_what_the_client_received(launcher: SimPool, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = launcher.start(
        "--profile", "tiny", "--tokens-per-event", "2", "--truth-log", str(truth)
    )  # fmt: skip
    usage = {"include_usage": True, "continuous_usage_stats": True}
    received: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        before = time.monotonic_ns()
        received["cmpl"] = _stream(
            client,
            "/v1/completions",
            {"prompt": "a b", "max_tokens": 7, "stream_options": usage, **GREEDY},
            "cmpl",
        )
        received["chat"] = _stream(
            client,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **GREEDY},
            "chat",
        )
        plain = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert plain.status_code == 200
        bad = client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
        assert bad.status_code == 400
    sim.stop()  # SIGTERM: the buffered lines are flushed on the way out

    lines = truth.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 4
    assert all(set(r) == KEYS for r in records)
    assert all(r["end"] == "done" and r["end_ns"] >= r["read_ns"] for r in records)
    by_id = {r["request_id"]: r for r in records}
    generated = [r for r in records if r["request_id"] not in received]
    assert {r["request_id"] for r in generated} == {"sim-1", "sim-2"}

    for request_id, (chunks, stamps) in received.items():
        rec = by_id[request_id]
        assert rec["status"] == 200
        path = "/v1/completions" if request_id == "cmpl" else "/v1/chat/completions"
        assert rec["path"] == path
        events = rec["events"]
        assert len(events) == len(chunks)
        assert len(rec["scheduled_ns"]) == len(events)
        choices = [c["choices"][0] for c in chunks]
        texts = [ch.get("text", ch.get("delta", {}).get("content")) for ch in choices]
        assert sum(n for _, n in events) == sum(len(t.split()) for t in texts)
        assert before <= rec["arrival_ns"] <= rec["read_ns"] <= events[0][0]
        emitted = [e for e, _ in events]
        assert emitted == sorted(emitted)
        assert rec["scheduled_ns"] == sorted(rec["scheduled_ns"])
        # Same clock on both sides. The sim stamps right after its write returns, so the
        # client may read an event a little before that stamp, never long before or after.
        for (sent, _), got in zip(events, stamps, strict=True):
            assert -5_000_000 < got - sent < 1_000_000_000
        if request_id == "cmpl":
            # With continuous usage the client can count tokens per event exactly.
            counts = [c["usage"]["completion_tokens"] for c in chunks]
            deltas = [b - a for a, b in zip([0, *counts], counts, strict=False)]
            assert [n for _, n in events] == deltas == [2, 2, 2, 1]

    plain_rec, bad_rec = sorted(generated, key=lambda r: r["request_id"])
    assert (plain_rec["status"], plain_rec["events"], plain_rec["scheduled_ns"]) == (200, [], [])
    assert (bad_rec["status"], bad_rec["events"]) == (400, [])
