"""Crash evidence from pod status (gate/engines/pod_status.py, pure): pods built from the
official client's models, as the kubelet reports them (tests/support/k8s_fake.py STAGES)."""

from __future__ import annotations

from k8s_fake import STAGES, to_json
from kubernetes import client

from gate.engines.pod_status import find_crash, pod_view

IMAGE = "vllm/vllm-openai:v0.11.0"


def _pod(name: str, uid: str, st: client.V1PodStatus, node: str | None = "n0") -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, uid=uid),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="engine")]),
        status=st,
    )


def test_crash_evidence_from_pod_status() -> None:
    running = STAGES["running"][0](IMAGE)
    up = [pod_view(_pod("p-0", "u0", running))]
    assert find_crash(up, {"p-0": "u0"}) is None

    evicted = client.V1PodStatus(
        phase="Failed", reason="Evicted", message="The node was low on resource: memory."
    )
    got = find_crash([pod_view(_pod("p-0", "u0", evicted))], {"p-0": "u0"})
    assert got is not None and "Evicted: The node was low on resource" in got.description

    gone = find_crash([], {"p-0": "u0"})
    assert gone is not None and "disappeared" in gone.description
    replaced = find_crash([pod_view(_pod("p-0", "u1", running))], {"p-0": "u0"})
    assert replaced is not None and "replaced" in replaced.description

    ended = client.V1PodStatus(
        phase="Running",
        container_statuses=[
            client.V1ContainerStatus(
                name="engine",
                image=IMAGE,
                image_id="x",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    terminated=client.V1ContainerStateTerminated(reason="Error", exit_code=3)
                ),
            )
        ],
    )
    got = find_crash([pod_view(_pod("p-0", "u0", ended))], {})
    assert (
        got is not None and got.exit_code == 3 and "exited (Error, exit code 3)" in got.description
    )

    # Round trip through the API's JSON, as the launcher sees it.
    oom = to_json(_pod("p-1", "u2", STAGES["oom_restarted"][0](IMAGE)))
    back = client.V1Pod.from_dict(oom)
    assert back is not None
    got = find_crash([pod_view(back)], {})
    assert got is not None and got.exit_code == 137 and got.previous
