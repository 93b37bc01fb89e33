"""Whole gates whose engines are worker groups behind a router: a prefill sim, a decode sim and
the sim's router per engine, each group on its own reserved GPUs of the local inventory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from gaterun import run_in_tmp

from gate.spec import parse_spec

pytestmark = pytest.mark.slow

FAST = ["--profile", "tiny"]
SHAPE = {
    "groups": [
        {"role": "prefill", "gpus": 2, "level": "host"},
        {"role": "decode", "gpus": 1, "level": "host"},
    ]
}


def pd(tag: str, decode: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "groups": {
            "prefill": {"preset": "sim", "args": [*FAST, "--tag", tag]},
            "decode": {
                "preset": "sim",
                "args": [*FAST, "--kv-transfer-ms", "2", "--tag", tag, *decode],
            },
        },
        "router": {"preset": "sim", "args": ["--tag", tag]},
    }


def run(tmp_path: Path, reference: dict[str, Any], candidate: dict[str, Any], **extra: Any) -> Any:
    spec = parse_spec(
        {
            "name": "pd",
            "model": "demo-model",
            "reference": reference,
            "candidate": candidate,
            "shape": SHAPE,
            "inventory": "examples/inventory/local.yaml",
            "scenarios": [{"name": "steady", "rate": 20, "requests": 168, "prompt_tokens": 32}],
            # Worker groups, not the verdict, are under test: 8 s of load is too short for the
            # paired latency checks to decide (5 time blocks of 2 s, not 8), allowed and left
            # undecided; fewer than 4 blocks could not compare latency at all, which holds.
            "policy": {"short_scenarios": "allow"},
        }
        | extra
    )
    out = run_in_tmp(spec, tmp_path)
    return out


def report(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "reports").rglob("*.html"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_group_engines_that_are_the_same_continue(tmp_path: Path, tag: str) -> None:
    out = run(tmp_path, pd(tag), pd(tag))
    doc = out.document
    assert doc["verdict"] == "continue", doc["reasons"]
    seen_gpus: list[int] = []
    for role in ("reference", "candidate"):
        eng = doc["engines"][role]
        groups = {g["role"]: g for g in eng["placement"]["groups"]}
        assert set(groups) == {"prefill", "decode"}
        assert len(groups["prefill"]["nodes"][0]["gpus"]) == 2
        assert len(groups["decode"]["nodes"][0]["gpus"]) == 1
        procs = {g["role"]: g for g in eng["groups"]}
        assert set(procs) == {"prefill", "decode", "router"}
        assert eng["url"] == procs["router"]["url"]  # load went to the router
        # each worker ran on its own group's GPUs (CUDA_VISIBLE_DEVICES = {group_gpus})
        assert procs["prefill"]["gpus"] == groups["prefill"]["nodes"][0]["gpus"]
        assert procs["decode"]["gpus"] == groups["decode"]["nodes"][0]["gpus"]
        assert procs["router"]["gpus"] == []
        for name in ("prefill", "decode", "router"):
            assert "model_listed" in procs[name]["phases"]
            assert not _alive(procs[name]["pid"])  # torn down
        seen_gpus += procs["prefill"]["gpus"] + procs["decode"]["gpus"]
        assert "decode.healthy" in eng["phases"] and "ready" in eng["phases"]
        # the launch measured over every group's processes and the router's
        assert eng["launch_host_busy"] is not None and eng["launch_cpu_wait_s"] is not None
    assert len(seen_gpus) == len(set(seen_gpus)) == 6  # disjoint across groups and engines
    text = report(tmp_path)  # each group's placement and lifecycle, in the card and timeline
    assert "<dt>prefill group</dt>" in text and "<dt>decode group</dt>" in text
    assert "<dt>router</dt>" in text and "candidate decode:" in text


def test_a_decode_worker_that_crashes_holds_naming_the_decode_group(
    tmp_path: Path, tag: str
) -> None:
    out = run(tmp_path, pd(tag), pd(tag, ("--crash-after-requests", "40")))
    doc = out.document
    assert doc["verdict"] == "hold"
    crash = doc["engines"]["candidate"]["crash"]
    assert crash["description"].startswith("decode group: process exited")
    assert any("--crash-after-requests" in line for line in crash["log_tail"])
    reason = next(r for r in doc["reasons"] if r["check"] == "crash.candidate")
    assert "candidate engine crashed: decode group: process exited with code 1" in reason["message"]
    procs = {g["role"]: g for g in doc["engines"]["candidate"]["groups"]}
    assert procs["decode"]["crashed"] and not procs["prefill"]["crashed"]
    for g in procs.values():  # every process stopped, the crashed group's and the rest
        assert not _alive(g["pid"])
    assert doc["engines"]["reference"]["crash"] is None
    assert "· crashed" in report(tmp_path)
