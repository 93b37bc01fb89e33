"""The cluster inventory source, through the official client against API-shaped responses."""

from __future__ import annotations

from k8s_fake import FakeKubernetes, to_json
from kubernetes import client

from gate.reservations.allocator import ShapeRequest, allocate, capacity
from gate.reservations.kubernetes import inventory_from_cluster


def k8s_node(
    name: str,
    *,
    product: str,
    mem_mib: int,
    gpus: int,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[client.V1Taint] | None = None,
    provider: str = "gce",
) -> client.V1Node:
    base = {
        "kubernetes.io/hostname": name,
        "topology.kubernetes.io/region": "us-central1",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(mem_mib),
        "nvidia.com/gpu.count": str(gpus),
        "cloud.google.com/gke-nodepool": "gate-pool",
    }
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={**base, **(labels or {})}),
        spec=client.V1NodeSpec(
            provider_id=f"{provider}://proj/us-central1-a/{name}",
            unschedulable=unschedulable,
            taints=taints,
        ),
        status=client.V1NodeStatus(
            allocatable={"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"},
            capacity={"nvidia.com/gpu": str(gpus)},
            conditions=[client.V1NodeCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def gpu_pod(name: str, node: str, gpus: int, phase: str = "Running") -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="prod"),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name="engine",
                    image="vllm/vllm-openai:v0.11.0",
                    resources=client.V1ResourceRequirements(
                        limits={"nvidia.com/gpu": str(gpus)}, requests={"nvidia.com/gpu": str(gpus)}
                    ),
                )
            ],
        ),
        status=client.V1PodStatus(phase=phase),
    )


def fleet() -> FakeKubernetes:
    gpu_taint = client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    broken = client.V1Taint(key="gpu.health/xid", value="79", effect="NoExecute")
    nodes = [
        k8s_node(
            f"gb-r0-{i}",
            product="NVIDIA-GB200",
            mem_mib=189_471,
            gpus=4,
            labels={"nvidia.com/gpu.clique": "a1b2.0"},
            taints=[gpu_taint],
        )
        for i in range(18)
    ]
    nodes += [
        k8s_node(
            "h200-0",
            product="NVIDIA-H200",
            mem_mib=143_771,
            gpus=8,
            labels={"cloud.google.com/gce-topology-block": "blk-1"},
        ),
        k8s_node("h200-1", product="NVIDIA-H200", mem_mib=143_771, gpus=8, ready=False),
        k8s_node("h200-2", product="NVIDIA-H200", mem_mib=143_771, gpus=8, unschedulable=True),
        k8s_node("h200-3", product="NVIDIA-H200", mem_mib=143_771, gpus=8, taints=[broken]),
        client.V1Node(
            metadata=client.V1ObjectMeta(name="cpu-0", labels={}),
            spec=client.V1NodeSpec(),
            status=client.V1NodeStatus(allocatable={"cpu": "64"}),
        ),
    ]
    pods = [
        gpu_pod("p1", "h200-0", 4),
        gpu_pod("p2", "gb-r0-0", 4),
        gpu_pod("done", "h200-0", 4, phase="Succeeded"),
    ]
    fake = FakeKubernetes()
    fake.json("GET", "/api/v1/nodes", to_json(client.V1NodeList(items=nodes)))
    fake.json("GET", "/api/v1/pods", to_json(client.V1PodList(items=pods)))
    return fake


def test_inventory_from_cluster_reads_labels_health_and_usage() -> None:
    fake = fleet()
    inv = inventory_from_cluster(client.CoreV1Api(fake.api_client()), cluster="c1")
    by = {n.name: n for n in inv.nodes}
    assert "cpu-0" not in by and len(by) == 22
    gb = by["gb-r0-3"]
    assert gb.normalised_sku == "GB200" and gb.gpus == 4
    assert round(gb.gpu_memory_gib) == 185
    assert gb.topology["clique"] == "a1b2.0" and gb.taints == []  # the GPU taint is tolerated
    assert gb.provider == "gce" and gb.pool == "gate-pool" and gb.region == "us-central1"
    assert by["gb-r0-0"].allocated_gpus == 4
    assert by["h200-0"].allocated_gpus == 4  # the finished pod holds nothing
    assert by["h200-0"].topology["block"] == "blk-1"
    assert not by["h200-1"].healthy and by["h200-2"].cordoned
    assert by["h200-3"].taints == ["gpu.health/xid=79:NoExecute"]
    paths = [p for _, p, _ in fake.requests]
    assert paths == ["/api/v1/nodes", "/api/v1/pods"]


def test_cluster_inventory_feeds_the_allocator() -> None:
    inv = inventory_from_cluster(client.CoreV1Api(fleet().api_client()), cluster="c1")
    shape = ShapeRequest(sku="GB200", gpus_per_engine=16, nodes_per_engine=4, engine_level="clique")
    cap = capacity(inv.nodes, shape)
    assert cap.engines == 4 and cap.gates == 2  # 17 free hosts in one clique: 4 engines
    h200 = ShapeRequest(sku="H200", gpus_per_engine=4)
    blocked = allocate(inv.nodes, h200)
    # h200-0 has 4 free GPUs (the other 4 run a prod pod), the rest are unhealthy or cordoned.
    assert not isinstance(blocked, type(None))
    assert getattr(blocked, "code", None) == "free_capacity"
    assert blocked.eliminated["health"] == 3  # type: ignore[union-attr]
