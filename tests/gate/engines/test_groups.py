"""Engines of several worker groups: the spec form against the shape, the presets per group and
as routers, and the argv each process gets."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from gate.core.errors import EngineError, SpecError
from gate.engines.groups import ROUTER, GroupedEngine, WorkerSpec
from gate.engines.lifecycle import Clock, PhaseLog
from gate.engines.presets import NIXL_BOTH, preset_argv
from gate.reservations.shapes import EnginePlacement, GroupPlacement
from gate.spec import parse_spec

SHAPE = {"groups": [{"role": "prefill", "gpus": 2}, {"role": "decode", "gpus": 1}]}
PD = {
    "groups": {"prefill": {"preset": "sim"}, "decode": {"preset": "sim"}},
    "router": {"preset": "sim"},
}


def spec(candidate: dict[str, Any], shape: dict[str, Any] | None = SHAPE) -> Any:
    data: dict[str, Any] = {
        "name": "t",
        "model": "m",
        "reference": PD,
        "candidate": candidate,
        "scenarios": [{"name": "s", "rate": 1, "requests": 1}],
    }
    if shape is not None:
        data["shape"] = shape
    return parse_spec(data)


def problems(candidate: dict[str, Any], shape: dict[str, Any] | None = SHAPE) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        spec(candidate, shape)
    return {p.path: p.message for p in err.value.problems}


def test_a_two_group_engine_is_a_process_engine() -> None:
    s = spec(PD)
    assert s.candidate.runtime == "process" and set(s.candidate.groups) == {"prefill", "decode"}


def test_each_group_of_the_shape_needs_one_of_the_engine_and_no_other() -> None:
    missing = {"groups": {"prefill": {"preset": "sim"}}, "router": {"preset": "sim"}}
    assert "missing" in problems(missing)["candidate.groups.decode"]
    extra = {**PD, "groups": {**PD["groups"], "encode": {"preset": "sim"}}}  # type: ignore[dict-item]
    assert "not a group of the shape" in problems(extra)["candidate.groups.encode"]


def test_a_single_process_engine_on_a_grouped_shape_is_refused() -> None:
    got = problems({"preset": "sim"})
    assert "one `groups` entry per group" in got["candidate.groups"]


def test_groups_need_a_shape_with_groups_and_a_router() -> None:
    assert "no `groups`" in problems(PD, shape=None)["candidate.groups"]
    assert "needs a `router`" in problems({"groups": PD["groups"]})["candidate"]


def test_addresses_name_groups_of_the_engine() -> None:
    bad = {**PD, "router": {"command": ["r", "--to", "{url:encode}"]}}
    assert "names no group" in problems(bad)["candidate.router"]
    single = {"command": ["x", "--peer", "{url:decode}"]}
    assert "worker group or router" in problems(single, shape=None)["candidate"]


def test_a_router_preset_serves_prefill_and_decode() -> None:
    shape = {"groups": [{"role": "a", "gpus": 1}, {"role": "b", "gpus": 1}]}
    eng = {"groups": {"a": {"preset": "sim"}, "b": {"preset": "sim"}}, "router": {"preset": "sim"}}
    assert "prefill and decode" in problems(eng, shape)["candidate.router.preset"]


def test_presets_add_each_role_flags() -> None:
    # vLLM's NIXL example runs both roles as kv_both behind the toy proxy
    # (vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, run_accuracy_test.sh).
    vllm = preset_argv("vllm", group="prefill")
    assert vllm[-2:] == ["--kv-transfer-config", NIXL_BOTH]
    own = preset_argv("vllm", group="decode", args=("--kv-transfer-config", "{}"))
    assert own.count("--kv-transfer-config") == 1
    # SGLang: --disaggregation-mode prefill|decode, the router is launch_lb's --prefill/--decode
    # (sglang python/sglang/srt/disaggregation/launch_lb.py).
    sg = preset_argv("sglang", group="decode")
    assert sg[sg.index("--disaggregation-mode") :][:2] == ["--disaggregation-mode", "{role}"]
    assert "--disaggregation-transfer-backend" in sg
    lb = preset_argv("sglang", group=ROUTER)
    assert lb[:3] == ["python", "-m", "sglang.srt.disaggregation.launch_lb"]
    assert lb[lb.index("--prefill") + 1] == "{url:prefill}"
    proxy = preset_argv("vllm", group=ROUTER)
    assert proxy[proxy.index("--decoder-ports") + 1] == "{port:decode}"
    assert preset_argv("sim", group="decode")[-2:] == ["--role", "{role}"]


def placement() -> EnginePlacement:
    groups = (
        GroupPlacement("prefill", ("n0",), ((4, 5),), "H200", "n0"),
        GroupPlacement("decode", ("n0",), ((6,),), "H200", "n0"),
    )
    return EnginePlacement("candidate", (("n0", (4, 5)), ("n0", (6,))), "H200", "n0", groups)


def grouped(tmp_path: Path, prefill: list[str], decode: list[str]) -> GroupedEngine:
    return GroupedEngine(
        role="candidate",
        workers=[WorkerSpec("prefill", prefill), WorkerSpec("decode", decode)],
        router=WorkerSpec(ROUTER, ["router", "--port", "{port}", "--p", "{url:prefill}"]),
        model="m",
        phases=PhaseLog("candidate", Clock()),
        log_dir=tmp_path,
        placement=placement(),
        readiness_timeout_s=5,
        gate_id=f"t-{uuid.uuid4().hex[:8]}",  # teardown kills by gate id: each test its own
        term_grace_s=1,
    )


def test_each_process_gets_its_group_gpus_role_and_peers(tmp_path: Path) -> None:
    eng = grouped(tmp_path, ["w", "{role}", "{group_gpus}", "{tp}", "{url:decode}"], ["w"])
    pre, dec, router = (eng.processes[n] for n in ("prefill", "decode", ROUTER))
    assert pre.argv()[1:] == ["prefill", "4,5", "2", dec.base_url]
    assert pre.environment()["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert dec.environment()["CUDA_VISIBLE_DEVICES"] == "6"
    assert router.argv()[-1] == pre.base_url and router.environment()["CUDA_VISIBLE_DEVICES"] == ""
    assert eng.base_url == router.base_url


def test_a_group_that_cannot_start_is_named_and_the_rest_is_stopped(tmp_path: Path) -> None:
    sim = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
    eng = grouped(tmp_path, sim, ["/nonexistent/engine"])

    async def go() -> None:
        try:
            await eng.start()
        finally:
            await eng.stop()

    with pytest.raises(EngineError) as err:
        asyncio.run(go())
    assert "decode group: could not start" in str(err.value)
    assert eng.processes["prefill"].crashed() is None  # stopped, not crashed
    proc = eng.processes["prefill"]._proc
    assert proc is None or proc.poll() is not None


# -- the kubernetes form ------------------------------------------------------------------------

KUBE = {
    "image": "vllm/vllm-openai:v0.11.0",
    "namespace": "llm-gate",
    "args": ["--model", "{model}", "--port", "{port}"],
    "groups": {"prefill": {"args": ["--role", "{role}"]}, "decode": {}},
    "router": {"command": ["router"], "args": ["--p", "{url:prefill}", "--d", "{url:decode}"]},
}


def kube_problems(
    candidate: dict[str, Any], shape: dict[str, Any] | None = SHAPE
) -> dict[str, str]:
    data: dict[str, Any] = {
        "name": "t",
        "model": "m",
        "reference": {"kubernetes": KUBE},
        "candidate": {"kubernetes": candidate},
        "scenarios": [{"name": "s", "rate": 1, "requests": 1}],
    }
    if shape is not None:
        data["shape"] = shape
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    return {p.path: p.message for p in err.value.problems}


def test_a_kubernetes_engine_with_groups_parses() -> None:
    data = {
        "name": "t",
        "model": "m",
        "shape": SHAPE,
        "reference": {"kubernetes": KUBE},
        "candidate": {"kubernetes": KUBE},
        "scenarios": [{"name": "s", "rate": 1, "requests": 1}],
    }
    s = parse_spec(data)
    assert s.candidate.runtime == "kubernetes" and s.candidate.kubernetes is not None
    assert set(s.candidate.kubernetes.groups or {}) == {"prefill", "decode"}


def test_kubernetes_groups_against_the_shape_name_their_field() -> None:
    missing = {**KUBE, "groups": {"prefill": {}}}
    assert "missing" in kube_problems(missing)["candidate.kubernetes.groups.decode"]
    extra = {**KUBE, "groups": {**KUBE["groups"], "encode": {}}}  # type: ignore[dict-item]
    assert "not a group" in kube_problems(extra)["candidate.kubernetes.groups.encode"]
    no_router = {k: v for k, v in KUBE.items() if k != "router"}
    assert "needs a `router`" in kube_problems(no_router)["candidate.kubernetes.router"]
    bad_ref = {**KUBE, "router": {"args": ["--x", "{url:encode}"]}}
    assert "names no group" in kube_problems(bad_ref)["candidate.kubernetes.router"]
    no_argv = {**KUBE, "args": [], "groups": {"prefill": {"args": ["x"]}, "decode": {}}}
    assert "command" in kube_problems(no_argv)["candidate.kubernetes.groups.decode"]


def test_a_single_group_kubernetes_engine_on_a_grouped_shape_is_refused() -> None:
    single = {k: v for k, v in KUBE.items() if k not in ("groups", "router")}
    got = kube_problems(single)
    assert "the shape has worker groups (prefill, decode)" in got["candidate.kubernetes.groups"]
    # and groups on a shape without them
    got = kube_problems(KUBE, shape=None)
    assert "no `groups`" in got["candidate.kubernetes.groups"]


def test_group_placeholders_need_groups_and_json_braces_are_no_placeholder() -> None:
    single = {"image": "vllm/vllm-openai:v0.11.0", "namespace": "ns", "args": ["{url:decode}"]}
    got = kube_problems(single, shape=None)
    assert any("worker group or router" in m for m in got.values())
    kv = {**KUBE, "groups": {"prefill": {"args": ['{"kv_role":"kv_both"}']}, "decode": {}}}
    data = {
        "name": "t",
        "model": "m",
        "shape": SHAPE,
        "reference": {"kubernetes": KUBE},
        "candidate": {"kubernetes": kv},
        "scenarios": [{"name": "s", "rate": 1, "requests": 1}],
    }
    parse_spec(data)
