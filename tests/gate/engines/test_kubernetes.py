"""The Kubernetes launcher through the real official client against a stateful fake API server.

The fake (tests/support/k8s_fake.py) stores what the launcher POSTs and serves it back; the
tests play the LeaderWorkerSet controller (pods from the templates, owned by the LWS) and the
kubelet (pod status built from the client's own models, one step per poll), and the engine's
HTTP side is a real local server reached through `base_url_override`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from k8s_fake import (
    STAGES,
    FakeKubernetes,
    Kubelet,
    ObjectStore,
    status,
    store_of,
    to_json,
    write_kubeconfig,
)
from kubernetes import client

from gate.core.errors import ClusterError, EngineError, ReadinessTimeout
from gate.engines.gate_lease import GateLease
from gate.engines.kubernetes import KUBERNETES_PHASES, KubernetesEngine
from gate.engines.kubernetes_groups import GroupedKubernetesEngine
from gate.engines.lifecycle import Clock, PhaseLog
from gate.engines.manifests import (
    EngineWorkload,
    engine_name,
    gate_labels,
    lease_name,
    render_lease,
)
from gate.reservations.kubernetes import (
    cluster_inventory,
    connect,
    reap_expired_leases,
    reap_namespaces,
)

NS = "llm-gate"
GATE_ID = "5a1b2c3d4e5f60718293a4b5c6d7e8f9"
MODEL = "demo-model"
IMAGE = "vllm/vllm-openai:v0.11.0"
CD = "resource.nvidia.com/computedomains"
LEASES = "coordination.k8s.io/leases"
FAST: dict[str, Any] = {"poll_s": 0.01, "stop_wait_s": 2.0}


# -- the engine's HTTP side ------------------------------------------------------------------


@dataclass
class EngineHttp:
    """/health and /v1/models of an engine, with knobs for the failure cases."""

    health_code: int = 200
    models: list[str] = field(default_factory=lambda: [MODEL])
    url: str = ""


@pytest.fixture
def http() -> Iterator[EngineHttp]:
    state = EngineHttp()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                code, body = state.health_code, b"{}"
            elif self.path == "/v1/models":
                code = 200
                body = json.dumps({"data": [{"id": m} for m in state.models]}).encode()
            else:
                code, body = 404, b"{}"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# -- the cluster ---------------------------------------------------------------------------


def h200(**kw: Any) -> EngineWorkload:
    return EngineWorkload(
        namespace=NS,
        gate_id=GATE_ID,
        role=kw.pop("role", "candidate"),
        image=IMAGE,
        model=MODEL,
        nodes=(kw.pop("node", "h200-a"),),
        gpus_per_node=2,
        args=("--model", "{model}", "--port", "{port}"),
        **kw,
    )


def gb200(**kw: Any) -> EngineWorkload:
    return EngineWorkload(
        namespace=NS,
        gate_id=GATE_ID,
        role="reference",
        image=IMAGE,
        model=MODEL,
        nodes=("gb-r0-h00", "gb-r0-h01", "gb-r0-h02", "gb-r0-h03"),
        gpus_per_node=4,
        command=("python3", "-m", "sglang.launch_server", "--node-rank", "$(LWS_WORKER_INDEX)"),
        clique="7f3a.0",
        **kw,
    )


def engine(fake: FakeKubernetes, workload: EngineWorkload, url: str, **kw: Any) -> KubernetesEngine:
    return KubernetesEngine(
        workload,
        PhaseLog(workload.role, Clock()),
        fake.api_client(),
        base_url_override=url,
        readiness_timeout_s=kw.pop("readiness_timeout_s", 10.0),
        **{**FAST, **kw},
    )


def deleted_paths(fake: FakeKubernetes) -> set[str]:
    return {c.path for c in fake.sent("DELETE")}


def ours_left(store: ObjectStore) -> list[str]:
    return [f"{r}/{n}" for (r, _, n), o in store.objects.items()]


def paths_for(workload: EngineWorkload, lease: str) -> dict[str, str]:
    name = workload.name
    out = {
        "lease": f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease}",
        "service": f"/api/v1/namespaces/{NS}/services/{name}-http",
    }
    if workload.multi_node:
        out["workload"] = (
            f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets/{name}"
        )
        out["compute_domain"] = (
            f"/apis/resource.nvidia.com/v1beta1/namespaces/{NS}/computedomains/{name}-imex"
        )
    else:
        out["workload"] = f"/api/v1/namespaces/{NS}/pods/{name}"
    return out


# -- lifecycle -------------------------------------------------------------------------------


def test_single_node_engine_walks_every_phase_then_tears_everything_down(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["pending", "creating", "running"])
    w = h200()
    lease = GateLease(fake.api_client(), namespace=NS, gate_id=GATE_ID)
    eng = engine(fake, w, http.url, lease=lease)
    assert eng.service_url == f"http://gate-5a1b2c3d4e5f-candidate-http.{NS}.svc:8000"
    assert eng.base_url == http.url and eng.pid is None and eng.launched

    uids: list[str | None] = []

    async def go() -> None:
        await eng.start()
        assert eng.crashed() is None
        uids.append(lease.uid)
        await eng.stop()

    asyncio.run(go())
    assert list(eng.phases.reached) == list(KUBERNETES_PHASES)
    times = [eng.phases.reached[p] for p in KUBERNETES_PHASES]
    assert times == sorted(times)

    # The Lease first; everything else owned by it, as rendered.
    posts = fake.sent("POST")
    assert [c.path.rsplit("/", 1)[-1] for c in posts] == ["leases", "services", "pods"]
    assert uids[0]
    for c in posts[1:]:
        owner = c.body["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Lease", lease.name, uids[0])
    pod_body = posts[2].body
    assert pod_body["spec"]["containers"][0]["args"] == ["--model", MODEL, "--port", "8000"]
    # What went over the wire (after the client's models) is still a valid object.
    for c in posts:
        kubernetes_validate.validate(c.body, "1.37", strict=True)
    assert eng.manifests is not None
    assert posts[1].body == eng.manifests.service and posts[2].body == eng.manifests.workload

    expected = paths_for(w, lease_name(GATE_ID))
    assert deleted_paths(fake) == set(expected.values())
    for c in fake.sent("DELETE"):
        assert c.body["propagationPolicy"] == "Background"
    assert ours_left(store_of(fake)) == []
    assert eng.crashed() is None  # stopped engines report no crash


def test_multi_node_gb200_engine_is_a_leader_worker_set_and_is_collected(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["pending", "creating", "running"])
    w = gb200()
    lease = GateLease(fake.api_client(), namespace=NS, gate_id=GATE_ID)
    eng = engine(fake, w, http.url, lease=lease)
    pods_seen: list[str] = []

    async def go() -> None:
        await eng.start()
        pods_seen.extend(sorted(p["spec"]["nodeName"] for p in store_of(fake).items("pods")))
        await eng.stop()

    asyncio.run(go())
    assert list(eng.phases.reached) == list(KUBERNETES_PHASES)
    assert pods_seen == list(w.nodes)  # one pod per reserved node, leader on the first
    posts = [c.path.rsplit("/", 1)[-1] for c in fake.sent("POST")]
    assert posts == ["leases", "computedomains", "services", "leaderworkersets"]
    assert eng.manifests is not None  # sent exactly as rendered (and validated there)
    assert [c.body for c in fake.sent("POST")][1:] == list(eng.manifests.objects)
    assert deleted_paths(fake) == set(paths_for(w, lease_name(GATE_ID)).values())
    assert ours_left(store_of(fake)) == []


def test_image_pull_failure_ends_the_start_naming_phase_and_image(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["pending", "creating", "pull_failed"])
    w = h200()
    eng = engine(fake, w, http.url)

    async def go() -> None:
        try:
            with pytest.raises(EngineError) as info:
                await eng.start()
        finally:
            await eng.stop()
        err = info.value
        assert not isinstance(err, ReadinessTimeout)
        assert err.phase == "image_pulled"
        assert IMAGE in err.message and "ErrImagePull" in err.message

    asyncio.run(go())
    assert "pods_scheduled" in eng.phases.reached and "image_pulled" not in eng.phases.reached
    # Standalone engine: a Lease of its own, named after the gate and the role.
    assert deleted_paths(fake) == set(paths_for(w, f"{lease_name(GATE_ID)}-candidate").values())
    assert ours_left(store_of(fake)) == []


@pytest.mark.parametrize(
    ("stage", "phase", "reached", "says"),
    [
        ("pull_backoff", "image_pulled", "pods_scheduled", "ImagePullBackOff"),
        ("config_error", "started", "image_pulled", 'CreateContainerConfigError: secret "hf"'),
    ],
)
def test_a_failure_seen_in_the_first_poll_still_marks_what_that_poll_showed(
    fake: FakeKubernetes, http: EngineHttp, stage: str, phase: str, reached: str, says: str
) -> None:
    """One poll can show the pod bound to its node and already failing: the phases it did
    reach are on the timeline, and the failure names the next one."""
    Kubelet(store_of(fake), [stage])
    eng = engine(fake, h200(), http.url)

    async def go() -> None:
        try:
            with pytest.raises(EngineError) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == phase and says in info.value.message

    asyncio.run(go())
    assert reached in eng.phases.reached and phase not in eng.phases.reached
    assert ours_left(store_of(fake)) == []


@pytest.mark.parametrize(
    ("stages", "health", "phase", "says", "timeout"),
    [
        (["unschedulable"], 200, "pods_scheduled", "0/4 nodes are available", 0.3),
        (["pending", "creating"], 200, "image_pulled", "ContainerCreating", 5.0),
        (["pending", "creating", "running"], 503, "healthy", "/health answered 503", 6.0),
    ],
)
def test_readiness_timeout_names_the_phase_it_stuck_in(
    fake: FakeKubernetes,
    http: EngineHttp,
    stages: list[str],
    health: int,
    phase: str,
    says: str,
    timeout: float,
) -> None:
    """The budgets leave the phases before the stuck one ample time on a busy machine."""
    Kubelet(store_of(fake), stages)
    http.health_code = health
    w = gb200()
    eng = engine(fake, w, http.url, readiness_timeout_s=timeout)

    async def go() -> None:
        try:
            with pytest.raises(ReadinessTimeout) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == phase
        assert f"was not ready after {timeout:g}s: stuck in phase {phase}" in info.value.message
        assert says in info.value.message

    asyncio.run(go())
    assert deleted_paths(fake) == set(paths_for(w, f"{lease_name(GATE_ID)}-reference").values())
    assert ours_left(store_of(fake)) == []


def test_a_crash_loop_during_start_is_named(fake: FakeKubernetes, http: EngineHttp) -> None:
    Kubelet(store_of(fake), ["pending", "creating", "crashloop"])
    eng = engine(fake, h200(), http.url)
    store_of(fake).previous_logs[(NS, eng.workload.name)] = "loading\nCUDA error: out of memory\n"

    async def go() -> None:
        try:
            with pytest.raises(EngineError) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == "started"
        assert "restarted (Error, exit code 1" in info.value.message

    asyncio.run(go())


def test_oom_kill_during_load_is_reported_with_reason_and_previous_log(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    kubelet = Kubelet(store_of(fake), ["pending", "creating", "running"])
    w = gb200()
    eng = engine(fake, w, http.url)
    store = store_of(fake)

    async def go() -> None:
        await eng.start()
        await asyncio.sleep(0.05)
        assert eng.crashed() is None
        worker = f"{w.name}-0-2"
        store.previous_logs[(NS, worker)] = "step 1\nstep 2\ntorch.OutOfMemoryError: CUDA\n"
        pod = store.get("pods", NS, worker)
        assert pod is not None
        kubelet.put(pod, "oom_restarted")
        for _ in range(500):
            if eng.crashed() is not None:
                break
            await asyncio.sleep(0.01)
        crash = eng.crashed()
        assert crash is not None
        assert crash.role == "reference" and crash.exit_code == 137
        assert "OOMKilled" in crash.description and worker in crash.description
        assert crash.log_tail[-1] == "torch.OutOfMemoryError: CUDA"
        assert crash.at_s > eng.phases.reached["model_listed"]
        await eng.stop()

    asyncio.run(go())
    logs = [c for c in fake.sent("GET", r".*/log") if c.query.get("previous") == ["true"]]
    assert logs and logs[0].query["container"] == ["engine"]


def test_a_failed_create_halfway_is_still_torn_down(fake: FakeKubernetes, http: EngineHttp) -> None:
    fake.route(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        lambda *_: (403, status(403, "Forbidden", 'pods is forbidden: User "gate" cannot create')),
    )
    w = h200()
    eng = engine(fake, w, http.url)

    async def go() -> None:
        try:
            with pytest.raises(EngineError) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == "launched"
        assert "403" in info.value.message and "forbidden" in info.value.message

    asyncio.run(go())
    # The pod's create was attempted, so its delete is too (a 404, tolerated).
    assert deleted_paths(fake) == set(paths_for(w, f"{lease_name(GATE_ID)}-candidate").values())
    assert "launched" not in eng.phases.reached
    assert ours_left(store_of(fake)) == []


def test_a_shared_gate_lease_goes_with_the_last_engine(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["creating", "running"])
    store = store_of(fake)
    lease = GateLease(fake.api_client(), namespace=NS, gate_id=GATE_ID)
    ref = engine(fake, h200(role="reference", node="h200-a"), http.url, lease=lease)
    cand = engine(fake, h200(role="candidate", node="h200-a"), http.url, lease=lease)

    async def go() -> None:
        await asyncio.gather(ref.start(), cand.start())
        assert len(fake.sent("POST", r".*/leases")) == 1
        await ref.stop()
        assert store.get(LEASES, NS, lease_name(GATE_ID)) is not None
        assert store.get("pods", NS, engine_name(GATE_ID, "candidate")) is not None
        await cand.stop()
        assert store.get(LEASES, NS, lease_name(GATE_ID)) is None

    asyncio.run(go())
    assert ours_left(store) == []


def test_log_tail_reads_the_leader_and_is_kept_after_stop(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["creating", "running"])
    w = gb200()
    eng = engine(fake, w, http.url)
    store_of(fake).logs[(NS, f"{w.name}-0")] = "".join(f"line {i}\n" for i in range(50))

    async def go() -> None:
        await eng.start()
        assert await asyncio.to_thread(eng.log_tail, 3) == ["line 47", "line 48", "line 49"]
        await eng.stop()

    asyncio.run(go())
    call = fake.sent("GET", r".*/log")[0]
    assert call.path == f"/api/v1/namespaces/{NS}/pods/{w.name}-0/log"
    assert call.query["tailLines"] == ["3"] and call.query["container"] == ["engine"]
    assert eng.log_tail(2) == ["line 48", "line 49"]  # the pod is gone; the tail was kept


def test_kill_now_deletes_everything_synchronously(fake: FakeKubernetes, http: EngineHttp) -> None:
    Kubelet(store_of(fake), ["creating", "running"])
    w = gb200()
    eng = engine(fake, w, http.url)

    async def go() -> None:
        await eng.start()
        eng.kill_now()
        assert deleted_paths(fake) == set(paths_for(w, f"{lease_name(GATE_ID)}-reference").values())
        await eng.stop()  # nothing left to do, and no error

    asyncio.run(go())
    assert ours_left(store_of(fake)) == []


def test_expired_gate_leases_are_reaped_with_what_they_own(fake: FakeKubernetes) -> None:
    store = store_of(fake)
    now = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
    old = render_lease(
        namespace=NS, gate_id="dead", holder="x", duration_s=60, now=now - dt.timedelta(minutes=5)
    )
    fresh = render_lease(
        namespace=NS, gate_id="alive", holder="x", duration_s=60, now=now - dt.timedelta(seconds=30)
    )
    foreign = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": NS},
        "spec": {"renewTime": "2020-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15},
    }
    for obj in (old, fresh, foreign):
        store.create(LEASES, obj)
    owned = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gate-dead-candidate",
            "namespace": NS,
            "labels": gate_labels("dead"),
            "ownerReferences": [
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "name": "gate-dead",
                    "uid": old["metadata"]["uid"],
                }
            ],
        },
        "spec": {"containers": [{"name": "engine", "image": IMAGE}]},
    }
    store.create("pods", owned)

    reaped = reap_expired_leases(fake.api_client(), NS, now=now)
    assert reaped == ["gate-dead"]
    assert store.get(LEASES, NS, "gate-alive") is not None
    assert store.get(LEASES, NS, "kube-scheduler") is not None  # not ours: never touched
    assert store.get("pods", NS, "gate-dead-candidate") is None  # collected with its owner


# -- reaching a cluster ----------------------------------------------------------------------


def test_connect_reads_the_kubeconfig_and_names_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeKubernetes(store=ObjectStore())
    fake.intercept(monkeypatch)
    path = write_kubeconfig(tmp_path / "kubeconfig", cluster="h200-prod", token="s3cret")
    api_client, cluster = connect(kubeconfig=str(path))
    with api_client:
        assert cluster == "h200-prod"
        assert api_client.configuration.host == "https://fake-apiserver.invalid"
        client.CoreV1Api(api_client).list_namespaced_pod(NS)
    (call,) = fake.sent("GET")
    assert call.path == f"/api/v1/namespaces/{NS}/pods"
    assert {k.lower(): v for k, v in call.headers.items()}["authorization"] == "Bearer s3cret"
    _, same = connect(kubeconfig=str(path), context="gate@h200-prod")
    assert same == "h200-prod"


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"context": "nope"}, "has no context 'nope' (its contexts: gate@h200-prod)"),
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "cannot use kubeconfig /nonexistent"),
        ({"in_cluster": True}, "cannot use the in-cluster service account"),
    ],
)
def test_connect_failures_are_cluster_errors(
    tmp_path: Path, kw: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = write_kubeconfig(tmp_path / "kubeconfig")
    args = kw if kw.get("in_cluster") else {"kubeconfig": str(path), **kw}
    with pytest.raises(ClusterError) as info:
        connect(**args)
    assert says in info.value.message


def test_cluster_inventory_leaves_gate_pods_to_the_reservations(fake: FakeKubernetes) -> None:
    """A node's GPUs held by another workload are subtracted; those of gate engine pods are
    not, since the gates' database reservations already count them."""
    store = store_of(fake)
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name="h200-a",
            labels={"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"},
        ),
        status=client.V1NodeStatus(
            allocatable={"nvidia.com/gpu": "8"},
            conditions=[client.V1NodeCondition(type="Ready", status="True")],
        ),
    )
    store.create("nodes", to_json(node))

    def pod(name: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {
                "nodeName": "h200-a",
                "containers": [
                    {
                        "name": "engine",
                        "image": IMAGE,
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
            "status": {"phase": "Running"},
        }

    store.create("pods", pod("training", 2, {"app": "train"}))
    store.create("pods", pod("gate-x-candidate", 4, gate_labels("x")))
    inv = cluster_inventory(fake.api_client(), "h200-prod")
    assert inv.name == "k8s:h200-prod"
    (got,) = inv.nodes
    assert (got.name, got.gpus, got.allocated_gpus, got.normalised_sku) == ("h200-a", 8, 2, "H200")


def test_reap_namespaces_reaps_each_namespace_and_survives_a_refusal(
    fake: FakeKubernetes,
) -> None:
    store = store_of(fake)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    for ns in (NS, "other"):
        store.create(
            LEASES, render_lease(namespace=ns, gate_id="dead", holder="x", duration_s=60, now=old)
        )
    fake.route(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/locked/leases",
        lambda *_: (403, status(403, "Forbidden", "leases is forbidden")),
    )
    reaped = reap_namespaces(fake.api_client(), [NS, "locked", "other", NS])
    assert reaped == [f"{NS}/gate-dead", "other/gate-dead"]
    assert store.items(LEASES) == []


# -- an engine of several worker groups ---------------------------------------------------------


def pd_engine(fake: FakeKubernetes, url: str, **kw: Any) -> GroupedKubernetesEngine:
    """Prefill a Pod on one node, decode a LeaderWorkerSet on two, a router Pod."""
    prefill = h200(group="prefill", node="h200-a")
    decode = dataclasses.replace(gb200(group="decode"), role="candidate")
    decode = dataclasses.replace(decode, nodes=decode.nodes[:2])
    router = dataclasses.replace(h200(group="router", shm_size=None), gpus_per_node=0)
    return GroupedKubernetesEngine(
        groups={"prefill": prefill, "decode": decode},
        router=router,
        phases=PhaseLog("candidate", Clock()),
        api_client=fake.api_client(),
        readiness_timeout_s=kw.pop("readiness_timeout_s", 10.0),
        base_url_override=url,
        group_url_overrides={"prefill": url, "decode": url},
        **{**FAST, **kw},
    )


def test_a_two_group_engine_comes_up_crashes_by_group_and_is_torn_down(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    kubelet = Kubelet(store_of(fake), ["pending", "creating", "running"])
    eng = pd_engine(fake, http.url)
    store = store_of(fake)
    base = engine_name(GATE_ID, "candidate")
    assert eng.service_url == f"http://{base}-router-http.{NS}.svc:8000"

    async def go() -> None:
        await eng.start()
        assert eng.crashed() is None
        pods = sorted(p["metadata"]["name"] for p in store.items("pods"))
        assert pods == [
            f"{base}-decode-0",
            f"{base}-decode-0-1",
            f"{base}-prefill",
            f"{base}-router",
        ]
        doc = eng.describe(None, None)
        assert doc.kubernetes is not None and len(doc.kubernetes.objects) == 7
        assert [g.role for g in doc.groups] == ["prefill", "decode", "router"]
        worker = f"{base}-decode-0-1"
        store.previous_logs[(NS, worker)] = "decode step\ntorch.OutOfMemoryError: CUDA\n"
        pod = store.get("pods", NS, worker)
        assert pod is not None
        kubelet.put(pod, "oom_restarted")
        for _ in range(500):
            if eng.crashed() is not None:
                break
            await asyncio.sleep(0.01)
        crash = eng.crashed()
        assert crash is not None and crash.group == "decode" and crash.exit_code == 137
        assert crash.description.startswith("decode group: ") and "OOMKilled" in crash.description
        assert crash.log_tail[-1] == "torch.OutOfMemoryError: CUDA"
        assert eng.describe(None, crash).groups[1].crashed
        await eng.stop()

    asyncio.run(go())
    reached = eng.phases.reached
    for phase in KUBERNETES_PHASES:  # the engine's, once every member reached it
        assert phase in reached
        assert reached[phase] >= max(
            reached[f"{m}.{phase}"] for m in ("prefill", "decode", "router")
        )
    # The router starts once both groups are ready.
    assert reached["router.launched"] >= max(
        reached["prefill.model_listed"], reached["decode.model_listed"]
    )
    posts = [c.path.rsplit("/", 1)[-1] for c in fake.sent("POST")]
    assert posts.count("leases") == 1 and posts.count("computedomains") == 1
    assert posts.count("leaderworkersets") == 1 and posts.count("pods") == 2
    assert posts.count("services") == 3
    assert ours_left(store) == []


def test_a_group_that_cannot_be_created_tears_the_whole_engine_down(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(store_of(fake), ["pending", "creating", "running"])
    fake.route(
        "POST",
        f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets",
        lambda *_: (403, status(403, "Forbidden", "leaderworkersets is forbidden")),
    )
    eng = pd_engine(fake, http.url)

    async def go() -> None:
        try:
            with pytest.raises(EngineError) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == "launched"
        assert info.value.message.startswith("candidate engine decode group: ")

    asyncio.run(go())
    assert "router.launched" not in eng.phases.reached
    assert ours_left(store_of(fake)) == []


def test_a_group_stuck_unschedulable_is_a_timeout_naming_it_and_everything_goes(
    fake: FakeKubernetes, http: EngineHttp
) -> None:
    Kubelet(
        store_of(fake),
        ["pending", "creating", "running"],
    )
    store = store_of(fake)

    def stuck(s: ObjectStore) -> None:  # the decode pods never get their nodes
        for pod in s.items("pods"):
            if (pod["metadata"].get("labels") or {}).get("gate.dev/group") == "decode":
                pod["spec"].pop("nodeName", None)
                pod["status"] = to_json(STAGES["unschedulable"][0](IMAGE))

    store.on_list.setdefault("pods", []).append(stuck)
    eng = pd_engine(fake, http.url, readiness_timeout_s=6.0)

    async def go() -> None:
        try:
            with pytest.raises(ReadinessTimeout) as info:
                await eng.start()
        finally:
            await eng.stop()
        assert info.value.phase == "pods_scheduled"
        assert "decode group: " in info.value.message and "Insufficient" in info.value.message

    asyncio.run(go())
    assert (
        "prefill.model_listed" in eng.phases.reached and "router.launched" not in eng.phases.reached
    )
    assert ours_left(store) == []
