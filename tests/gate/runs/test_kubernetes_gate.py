"""Whole gates with both engines of the kubernetes kind, through the official client against
the stateful fake API server (tests/support/k8s_fake.py).

What is real here: the spec, the gate runner, the SQLite reservations, the kubeconfig loading
(`connect`), every API call through the official `kubernetes` client, the cluster inventory,
the load (mirrored to two real sim engine processes) and the judge. What is played: the
cluster. The fake stores and serves objects; the tests play the kubelet (pod status, one stage
per poll) and the LWS controller; and, since a pod's Service address means nothing here, each
engine's `base_url_override` points at its sim process. No real API server, kubelet, scheduler,
image pull or GPU is involved.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from k8s_fake import (
    LWS,
    FakeKubernetes,
    Kubelet,
    ObjectStore,
    lws_controller,
    to_json,
    write_kubeconfig,
)
from kubernetes import client
from sqlalchemy import create_engine, text

import gate.engines.kubernetes as kubernetes_engines
from gate.core.settings import Settings
from gate.engines.kubernetes import KubernetesEngine
from gate.engines.launchers import free_port
from gate.engines.manifests import MANAGED_BY_LABEL, MANAGER, gate_labels, render_lease
from gate.runs.progress import NullProgress
from gate.runs.runner import GateOutcome, run_gate
from gate.spec import parse_spec

pytestmark = pytest.mark.slow

NS = "llm-gate"
MODEL = "demo-model"
REFERENCE = "vllm/vllm-openai:v0.11.0"
CANDIDATE = "vllm/vllm-openai:v0.11.1"
LEASES = "coordination.k8s.io/leases"
K8S_PHASES = [
    "launched",
    "pods_scheduled",
    "image_pulled",
    "started",
    "port_open",
    "healthy",
    "model_listed",
    "warmup_done",
    "ready",
]


# -- the cluster and the engines' HTTP side ---------------------------------------------------


def gpu_node(
    name: str,
    product: str = "NVIDIA-H200",
    mib: int = 143_771,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A GPU node as GPU Feature Discovery and GKE label it."""
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/region": "us-central1",
                "cloud.google.com/gce-topology-block": "b0",
                "cloud.google.com/gke-nodepool": "gpu",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(mib),
                "nvidia.com/gpu.count": str(gpus),
                **(labels or {}),
            },
        ),
        spec=client.V1NodeSpec(
            provider_id=f"gce://proj/us-central1-a/{name}",
            taints=[client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")],
        ),
        status=client.V1NodeStatus(
            allocatable={"nvidia.com/gpu": str(gpus), "cpu": "192", "memory": "2Ti"},
            conditions=[client.V1NodeCondition(type="Ready", status="True")],
        ),
    )
    return dict(to_json(node))


def gpu_pod(name: str, node: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "engine",
                    "image": "trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


@dataclass
class Cluster:
    fake: FakeKubernetes
    store: ObjectStore
    kubeconfig: Path
    urls: dict[str, str]

    def ours(self) -> list[str]:
        """Objects the gate system made that are still stored."""
        return sorted(
            f"{r}/{n}"
            for (r, _, n), o in self.store.objects.items()
            if (o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGER
        )


@pytest.fixture
def sims(find_processes: Callable[[str], list[int]]) -> Iterator[dict[str, str]]:
    """Two real sim engines, standing in for what the reference and candidate pods serve."""
    tag = uuid.uuid4().hex
    procs, urls = [], {}
    for role, seed in (("reference", "1"), ("candidate", "2")):
        port = free_port()
        argv = [sys.executable, "-m", "simengine", "--port", str(port)]
        argv += ["--model", MODEL, "--seed", seed, "--tag", tag]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        urls[role] = f"http://127.0.0.1:{port}"
    try:
        for url in urls.values():
            for _ in range(300):
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
    assert find_processes(tag) == []


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sims: dict[str, str]) -> Cluster:
    store = ObjectStore()
    store.on_create.setdefault(LWS, []).append(lws_controller)
    fake = FakeKubernetes(store=store)
    fake.intercept(monkeypatch)  # clients built from the kubeconfig talk to the fake
    for name in ("h200-a", "h200-b", "h200-c"):
        store.create("nodes", gpu_node(name))
    store.create("pods", gpu_pod("trainer", "h200-c", 4, {"app": "train"}))  # h200-c half used

    class Reachable(KubernetesEngine):
        """The engine as the gate builds it, reached at its sim instead of its Service."""

        def __post_init__(self) -> None:
            self.base_url_override = sims[self.workload.role]
            self.poll_s, self.stop_wait_s = 0.2, 5.0
            super().__post_init__()

    monkeypatch.setattr(kubernetes_engines, "KubernetesEngine", Reachable)
    return Cluster(fake, store, write_kubeconfig(tmp_path / "kubeconfig", namespace=NS), sims)


# The least load that still compares latency (and so can continue): 5 time blocks of 2 s. A
# scenario of fewer than 4 blocks cannot be compared at all, which holds (judge v3).
SHORT = {"requests": 168, "rate": 20.0}


def kube_spec(
    c: Cluster, *, requests: int = 400, rate: float = 40.0, **candidate: Any
) -> dict[str, Any]:
    def engine(image: str) -> dict[str, Any]:
        return {
            "image": image,
            "namespace": NS,
            "kubeconfig": str(c.kubeconfig),
            "args": ["--model", "{model}", "--port", "{port}", "--tensor-parallel-size", "{tp}"],
            "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
            "memory": "512Gi",
        }

    timeout = candidate.pop("readiness_timeout_s", 60)
    return {
        "name": "k8s",
        "model": MODEL,
        "reference": {"kubernetes": engine(REFERENCE), "readiness_timeout_s": 60},
        "candidate": {"kubernetes": engine(CANDIDATE), "readiness_timeout_s": timeout},
        "shape": {"sku": "H200", "gpus_per_engine": 8, "together": "block"},
        # This machine is shared and small: two identical sims can differ by more than the
        # default 5% at p50 while other work runs. What is under test is the Kubernetes path,
        # not the judge's resolution, so the tolerance is wide enough not to flake, and the
        # scenario (10 s, 5 time blocks) is shorter than the paired checks need to decide:
        # allowed, its latency left undecided.
        "policy": {
            "tolerance": {"p50": 0.3, "p90": 0.5, "p99": 0.5},
            "short_scenarios": "allow",
        },
        "scenarios": [
            {
                "name": "steady",
                "arrival": "poisson",
                "rate": rate,
                "requests": requests,
                "prompt_tokens": 64,
                "max_tokens": 16,
            }
        ],
    }


def gate(tmp_path: Path, spec: dict[str, Any], **kw: Any) -> GateOutcome:
    settings = Settings(data_dir=tmp_path / ".gate")
    return asyncio.run(
        run_gate(
            parse_spec(spec),
            settings,
            report_dir=tmp_path / "reports",
            db_url=f"sqlite:///{tmp_path / 'g.db'}",
            **kw,
        )
    )


def db_rows(tmp_path: Path, sql: str) -> list[Any]:
    eng = create_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with eng.connect() as conn:
        rows = list(conn.execute(text(sql)))
    eng.dispose()
    return rows


def assert_torn_down(c: Cluster, tmp_path: Path) -> None:
    """Every object the gate created was deleted, its Lease too, and its GPUs released."""
    created = {call.path + "/" + call.body["metadata"]["name"] for call in c.fake.sent("POST")}
    deleted = {call.path for call in c.fake.sent("DELETE")}
    assert created and created <= deleted, created - deleted
    assert c.ours() == []
    assert [p["metadata"]["name"] for p in c.store.items("pods")] == ["trainer"]
    assert db_rows(tmp_path, "select count(*) from gpu_leases")[0][0] == 0
    assert db_rows(tmp_path, "select state from reservations") == [("released",)]


# -- whole gates -----------------------------------------------------------------------------


def test_kubernetes_gate_runs_the_load_through_pods_and_cleans_up(
    tmp_path: Path, cluster: Cluster
) -> None:
    c = cluster
    # A gate that died an hour ago without teardown: its Lease expired, its pod is still there.
    dead = c.store.create(
        LEASES,
        render_lease(
            namespace=NS,
            gate_id="dead",
            holder="x",
            duration_s=60,
            now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1),
        ),
    )
    orphan = gpu_pod("gate-dead-candidate", "h200-b", 8, gate_labels("dead"))
    owner = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": "gate-dead"}
    orphan["metadata"]["ownerReferences"] = [{**owner, "uid": dead["metadata"]["uid"]}]
    c.store.create("pods", orphan)
    Kubelet(c.store, ["pending", "creating", "running"])

    out = gate(tmp_path, kube_spec(c))
    doc = out.document

    assert (out.verdict, out.exit_code, doc["state"]) == ("continue", 0, "complete"), doc["reasons"]
    ids = {ch["id"] for ch in doc["checks"]}
    assert {"steady.ttft.p50", "steady.itl.p50", "steady.errors", "startup.ready"} <= ids
    # Nothing holds: every check passed, or is an optional latency check left undecided that
    # says no regression was shown, or that its 5 blocks (the scenario is short, allowed) are
    # too few to compare it (a quantile above the median takes two blocks at a time). The
    # Kubernetes path, not the judge's resolution, is what this test is about.
    for ch in doc["checks"]:
        msg = ch["message"]
        assert ch["decision"] == "pass" or (
            ch["decision"] == "undecided"
            and not ch["required"]
            and ("no regression was shown" in msg or "cannot be compared" in msg)
        ), ch
    steady = doc["scenarios"][0]
    # The load really flowed to both engines (the sims behind the pods).
    for role in ("reference", "candidate"):
        assert steady[role]["requests"] == {"sent": 400, "ok": 400, "errors": 0, "resent": 0}, (
            steady[role]
        )
    # Reserved from the cluster's nodes: one whole H200 host each; h200-c is half used.
    ref, cand = doc["engines"]["reference"], doc["engines"]["candidate"]
    assert {ref["placement"]["node"], cand["placement"]["node"]} == {"h200-a", "h200-b"}
    for e, image in ((ref, REFERENCE), (cand, CANDIDATE)):
        assert e["kind"] == "kubernetes" and e["pid"] is None and e["log"] is None
        assert e["placement"]["gpus"] == list(range(8)) and e["placement"]["sku"] == "H200"
        assert list(e["phases"])[: len(K8S_PHASES)] == K8S_PHASES
        times = [e["phases"][p] for p in K8S_PHASES]
        assert times == sorted(times) and e["ready_s"] > 0
        k = e["kubernetes"]
        assert (k["namespace"], k["image"], k["lease"]) == (NS, image, f"gate-{out.gate_id}")
        assert k["service_url"].endswith(f".{NS}.svc:8000")
        assert [o.split()[0] for o in k["objects"]] == ["Service", "Pod"]
    # The test bed keeps each image and the digest its pod runs (the kubelet's imageID in
    # the container status, which the fake API server fills as `image@sha256:...`).
    for role, image in (("reference", REFERENCE), ("candidate", CANDIDATE)):
        sw = doc["testbed"]["engines"][role]
        assert sw["image"] == image and sw["image_digest"] == f"{image}@sha256:ab"
    assert doc["testbed"]["aa"] is False
    assert doc["reservation"]["placement"]["engines"][0]["sku"] == "H200"
    assert db_rows(tmp_path, "select inventory from reservations") == [("k8s:h200-prod",)]

    # What went to the API server: one Lease for the gate, then per engine a Service and a
    # Pod pinned to its reserved node, owned by the Lease, with the spec's argv and env.
    posts = c.fake.sent("POST")
    assert [p.path.rsplit("/", 1)[-1] for p in posts].count("leases") == 1
    pods = {
        p.body["metadata"]["labels"]["gate.dev/role"]: p.body
        for p in posts
        if p.path.endswith("/pods")
    }
    for role, image in (("reference", REFERENCE), ("candidate", CANDIDATE)):
        container = pods[role]["spec"]["containers"][0]
        assert container["image"] == image
        assert container["args"] == [
            "--model",
            MODEL,
            "--port",
            "8000",
            "--tensor-parallel-size",
            "8",
        ]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "memory": "512Gi"}
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_LOGGING_LEVEL"]["value"] == "INFO"
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        affinity = pods[role]["spec"]["affinity"]["nodeAffinity"]
        term = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        assert term["matchExpressions"][0]["values"] == [doc["engines"][role]["placement"]["node"]]
        assert pods[role]["metadata"]["ownerReferences"][0]["kind"] == "Lease"
    # Authenticated with the kubeconfig's token.
    auth = {
        dict((k.lower(), v) for k, v in call.headers.items()).get("authorization")
        for call in c.fake.calls
    }
    assert auth == {"Bearer gate-token"}

    # The dead gate's Lease was reaped at the start, and its pod went with it.
    assert c.store.get(LEASES, NS, "gate-dead") is None
    assert c.store.get("pods", NS, "gate-dead-candidate") is None
    assert_torn_down(c, tmp_path)
    assert db_rows(tmp_path, "select state, verdict from gates") == [("complete", "continue")]


def test_a_multi_node_gb200_gate_runs_leader_worker_sets_in_one_clique(
    tmp_path: Path, cluster: Cluster
) -> None:
    """Two engines of 2 GB200 nodes x 4 GPUs each, both inside one NVLink clique: per engine
    a ComputeDomain, a Service and a LeaderWorkerSet whose pods the fake's LWS controller makes."""
    c = cluster
    clique = "7f3a0c1e-9d2b-4c55-8a61-0b6c2d9e4f10.0"
    for i in range(4):
        c.store.create(
            "nodes",
            gpu_node(f"gb-r0-{i}", "NVIDIA-GB200", 189_471, 4, {"nvidia.com/gpu.clique": clique}),
        )
    Kubelet(c.store, ["pending", "creating", "running"])
    spec = kube_spec(c, **SHORT)
    spec["shape"] = {
        "sku": "GB200",
        "gpus_per_engine": 8,
        "nodes_per_engine": 2,
        "engine_level": "clique",
    }
    out = gate(tmp_path, spec)
    doc = out.document

    assert (out.verdict, out.exit_code) == ("continue", 0), doc["reasons"]
    nodes = set()
    for role in ("reference", "candidate"):
        e = doc["engines"][role]
        assert list(e["phases"])[: len(K8S_PHASES)] == K8S_PHASES
        placed = [n["node"] for n in e["placement"]["nodes"]]
        assert len(placed) == 2 and e["placement"]["domain"].endswith(f"/clique={clique}")
        nodes |= set(placed)
        k = e["kubernetes"]
        assert k["clique"] == clique and k["workload"].startswith("LeaderWorkerSet ")
        assert [o.split()[0] for o in k["objects"]] == [
            "ComputeDomain",
            "Service",
            "LeaderWorkerSet",
        ]
    assert nodes == {f"gb-r0-{i}" for i in range(4)}
    lws = [p.body for p in c.fake.sent("POST") if p.path.endswith("/leaderworkersets")]
    assert len(lws) == 2
    for body in lws:
        group = body["spec"]["leaderWorkerTemplate"]
        assert group["size"] == 2
        leader = group["leaderTemplate"]["spec"]
        assert leader["nodeSelector"] == {"nvidia.com/gpu.clique": clique}
        assert leader["containers"][0]["args"][-1] == "4"  # {tp}: GPUs per node
        assert leader["resourceClaims"][0]["name"] == "imex-channel"
    assert_torn_down(c, tmp_path)


class OomAfter(NullProgress):
    """Plays the kubelet when the candidate's container is OOM-killed and restarted, once
    `after` requests of the scenario are done."""

    def __init__(self, c: Cluster, kubelet: Kubelet, after: int) -> None:
        self.c, self.kubelet, self.after, self.done_at = c, kubelet, after, -1

    def request_done(self, name: str, done: int, total: int) -> None:
        if done < self.after or self.done_at >= 0:
            return
        self.done_at = done
        (pod,) = [
            p
            for p in self.c.store.items("pods", NS)
            if p["metadata"]["labels"].get("gate.dev/role") == "candidate"
        ]
        name = pod["metadata"]["name"]
        self.c.store.previous_logs[(NS, name)] = (
            "INFO serving\ntorch.OutOfMemoryError: CUDA out of memory\n"
        )
        self.kubelet.put(pod, "oom_restarted")


def test_a_pod_restarted_by_an_oom_kill_mid_load_holds_naming_the_crash(
    tmp_path: Path, cluster: Cluster
) -> None:
    c = cluster
    kubelet = Kubelet(c.store, ["pending", "creating", "running"])
    progress = OomAfter(c, kubelet, after=100)
    out = gate(tmp_path, kube_spec(c, requests=2000), progress=progress)
    doc = out.document

    assert progress.done_at >= 100
    assert (out.verdict, out.exit_code) == ("hold", 1), doc
    crash = next(r for r in doc["reasons"] if r["check"] == "crash.candidate")
    assert "OOMKilled, exit code 137" in crash["message"] and "restarted" in crash["message"]
    seen = doc["engines"]["candidate"]["crash"]
    assert seen["exit_code"] == 137 and "OOMKilled" in seen["description"]
    assert seen["log_tail"][-1] == "torch.OutOfMemoryError: CUDA out of memory"
    assert seen["at_s"] > doc["engines"]["candidate"]["phases"]["ready"]
    assert doc["engines"]["reference"]["crash"] is None
    # The scenario stopped at the crash instead of running its 2000 requests.
    assert doc["scenarios"][0]["aborted"] is True
    assert doc["scenarios"][0]["candidate"]["requests"]["sent"] < 2000
    assert_torn_down(c, tmp_path)


def test_a_pod_stuck_in_image_pull_back_off_holds_naming_the_phase(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A pull that fails is not waited out: a wrong tag does not fix itself."""
    c = cluster
    Kubelet(
        c.store,
        ["pending", "creating", "running"],
        by_role={"candidate": ["pending", "creating", "pull_backoff"]},
    )
    out = gate(tmp_path, kube_spec(c))
    doc = out.document

    assert (out.verdict, out.exit_code, doc["state"]) == ("hold", 2, "error"), doc
    (reason,) = doc["reasons"]
    assert reason["check"] == "gate.engine_error"
    msg = reason["message"]
    assert msg.startswith("candidate engine could not pull image " + CANDIDATE)
    assert "ImagePullBackOff" in msg and msg.endswith("during image_pulled")
    phases = doc["engines"]["candidate"]["phases"]
    assert "pods_scheduled" in phases and "image_pulled" not in phases
    assert doc["scenarios"] == []
    assert_torn_down(c, tmp_path)


def test_a_pull_that_never_finishes_is_a_readiness_timeout_naming_the_phase(
    tmp_path: Path, cluster: Cluster
) -> None:
    c = cluster
    Kubelet(
        c.store,
        ["pending", "creating", "running"],
        by_role={"candidate": ["pending", "creating"]},  # ContainerCreating for ever
    )
    out = gate(tmp_path, kube_spec(c, readiness_timeout_s=6))
    doc = out.document

    assert (out.verdict, out.exit_code, doc["state"]) == ("hold", 2, "error"), doc
    (reason,) = doc["reasons"]
    assert reason["check"] == "gate.readiness_timeout"
    assert (
        "candidate engine was not ready after 6s: stuck in phase image_pulled" in reason["message"]
    )
    assert "ContainerCreating" in reason["message"]
    assert_torn_down(c, tmp_path)


def test_a_kubeconfig_that_cannot_be_used_holds_before_reserving(
    tmp_path: Path, cluster: Cluster
) -> None:
    spec = kube_spec(cluster)
    for role in ("reference", "candidate"):
        spec[role]["kubernetes"]["context"] = "prod"
    out = gate(tmp_path, spec)
    assert (out.verdict, out.exit_code) == ("hold", 2)
    (reason,) = out.document["reasons"]
    assert reason["check"] == "gate.cluster_error"
    assert "has no context 'prod' (its contexts: gate@h200-prod)" in reason["message"]
    assert cluster.fake.calls == [] and out.document["reservation"] is None


def test_a_lost_workers_pods_are_collected_without_waiting_for_another_gate(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A worker died mid-gate with its pods up. A reaper ends the gate in hold and, once the
    gate's Lease has expired, deletes it; the pods the Lease owns go with it."""
    from sqlalchemy import update

    from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
    from gate.models import GateRun
    from gate.service import service
    from gate.service.reaper import Reaper

    c = cluster
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    upgrade(engine)
    factory = make_sessionmaker(engine)
    run, _ = service.create_gate(factory, parse_spec(kube_spec(c)), source="test")
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with transaction(factory) as s:  # it was running on a worker that stopped an hour ago
        s.execute(
            update(GateRun)
            .where(GateRun.id == run.id)
            .values(state="running", worker="w-dead", heartbeat_at=long_ago)
        )
    lease = c.store.create(
        LEASES,
        render_lease(namespace=NS, gate_id=run.id, holder="w-dead", duration_s=60, now=long_ago),
    )
    owner = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": f"gate-{run.id}"}
    for role in ("reference", "candidate"):
        pod = gpu_pod(f"gate-{run.id}-{role}", "h200-a", 8, gate_labels(run.id))
        pod["metadata"]["ownerReferences"] = [{**owner, "uid": lease["metadata"]["uid"]}]
        c.store.create("pods", pod)
    # Another gate's Lease, renewed just now: never touched.
    fresh = render_lease(
        namespace=NS, gate_id="alive", holder="w", duration_s=60, now=dt.datetime.now(dt.UTC)
    )
    c.store.create(LEASES, fresh)

    assert Reaper(Settings(data_dir=tmp_path / ".gate"), factory).once() == [run.id]
    ended = service.get_gate(factory, run.id)
    assert (ended.state, ended.verdict) == ("error", "hold")
    assert c.store.get(LEASES, NS, f"gate-{run.id}") is None
    assert [p["metadata"]["name"] for p in c.store.items("pods")] == ["trainer"]
    assert c.store.get(LEASES, NS, "gate-alive") is not None
    engine.dispose()


def test_a_two_group_kubernetes_gate_runs_a_workload_per_group_and_a_router(
    tmp_path: Path, cluster: Cluster
) -> None:
    """Disaggregated engines through the whole gate: per engine a Pod per worker group on
    that group's reserved GPUs and a GPU-less router Pod, every one reached (here) at its
    engine's sim; the load goes to the router, and everything is deleted at the end."""
    c = cluster
    Kubelet(c.store, ["pending", "creating", "running"])
    spec = kube_spec(c, **SHORT)
    for role in ("reference", "candidate"):
        k = spec[role]["kubernetes"]
        k["groups"] = {
            "prefill": {"args": ["--role", "{role}", "--gpus", "{group_gpus}"]},
            "decode": {"args": ["--role", "{role}", "--prefill", "{url:prefill}"]},
        }
        k["router"] = {
            "command": ["router"],
            "args": ["--prefill", "{url:prefill}", "--decode", "{url:decode}", "--port", "{port}"],
        }
    spec["shape"] = {
        "sku": "H200",
        "groups": [{"role": "prefill", "gpus": 4}, {"role": "decode", "gpus": 4}],
        "together": "block",
    }
    out = gate(tmp_path, spec)
    doc = out.document
    assert (out.verdict, out.exit_code) == ("continue", 0), doc["reasons"]
    gpus: set[tuple[str, int]] = set()
    for role in ("reference", "candidate"):
        groups = doc["engines"][role]["placement"]["groups"]
        assert [g["role"] for g in groups] == ["prefill", "decode"]
        for g in groups:
            for n in g["nodes"]:
                here = {(n["node"], i) for i in n["gpus"]}
                assert not gpus & here, "a GPU given twice"
                gpus |= here
    assert len(gpus) == 16
    pods = [p.body for p in c.fake.sent("POST") if p.path.endswith("/pods")]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for body in pods:
        by_group.setdefault(body["metadata"]["labels"].get("gate.dev/group", ""), []).append(body)
    assert sorted(by_group) == ["decode", "prefill", "router"], sorted(by_group)
    for body in by_group["router"]:
        limits = body["spec"]["containers"][0].get("resources", {}).get("limits", {})
        assert "nvidia.com/gpu" not in limits
        args = body["spec"]["containers"][0]["args"]
        assert any(a.endswith("-prefill-http.llm-gate.svc:8000") for a in args), args
    for body in by_group["prefill"]:
        limits = body["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "4"
    assert_torn_down(c, tmp_path)
