"""Engine manifests: valid for the API server that would receive them, pinned to the reserved
nodes, owned by the gate's Lease, and never a shell string.

Core objects are validated with `kubernetes-validate` (Kubernetes 1.37, strict: unknown fields
are errors), the LeaderWorkerSet with the openAPIV3Schema of the LWS CRD in
../shared/schemas (read here, never copied), made strict the same way: an API server prunes
fields a structural schema does not know, so a field the schema lacks would be dropped without
a word, which for a manifest we write is a bug.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes import client

from gate.engines.manifests import (
    GATE_ID_LABEL,
    MANAGED_BY_LABEL,
    ROLE_LABEL,
    EngineWorkload,
    clique_of,
    engine_name,
    lease_name,
    pod_selector,
    render_engine,
    render_lease,
)
from gate.reservations.allocator import Placement, ShapeRequest, allocate
from gate.reservations.inventory import load_inventory
from gate.reservations.kubernetes import CLIQUE
from gate.reservations.shapes import EnginePlacement, GroupPlacement
from gate.runs.kubernetes_kind import group_workloads
from gate.spec import KubernetesGroupSpec, KubernetesRouterSpec, KubernetesSpec

K8S_VERSION = "1.37"
ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "inventory"
SCHEMAS = ROOT.parent / "shared" / "schemas"
LWS_CRD = SCHEMAS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
GATE_ID = "eb0e97fce58b414988b51b72ead8316a"
LEASE_UID = "4f6c1c1e-55a8-4d0c-9a43-3b8f2a1c9d10"
NOW = dt.datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)

# The ComputeDomain's schema, cut down from the NVIDIA DRA driver's CRD
# (NVIDIA/k8s-dra-driver-gpu, deployments/helm/nvidia-dra-driver-gpu/crds/
# resource.nvidia.com_computedomains.yaml, v1beta1): spec requires `numNodes` (an integer, zero
# or more) and `channel`, which requires `resourceClaimTemplate.name`; `allocationMode` is
# Single or All. Those are the only fields the gate writes, and the only ones a pod depends on
# (the claim template's name). Closed objects, for the same pruning reason as above.
COMPUTE_DOMAIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "resource.nvidia.com/v1beta1"},
        "kind": {"const": "ComputeDomain"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["numNodes", "channel"],
            "additionalProperties": False,
            "properties": {
                "numNodes": {"type": "integer", "minimum": 0},
                "channel": {
                    "type": "object",
                    "required": ["resourceClaimTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "allocationMode": {"enum": ["All", "Single"]},
                        "resourceClaimTemplate": {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string", "minLength": 1}},
                        },
                    },
                },
            },
        },
    },
}

SGLANG_ARGS = (
    "python3",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "{model}",
    "--tp",
    "{total_gpus}",
    "--dist-init-addr",
    "$(LWS_LEADER_ADDRESS):20000",
    "--nnodes",
    "$(LWS_GROUP_SIZE)",
    "--node-rank",
    "$(LWS_WORKER_INDEX)",
    "--host",
    "{host}",
    "--port",
    "{port}",
)


# -- validators ------------------------------------------------------------------------------


def validate_core(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@functools.cache
def lws_validator() -> jsonschema.Draft7Validator:
    if not LWS_CRD.exists():
        # CI always has ../shared beside the clone: there a missing schema is a failure.
        msg = f"the LWS CRD is not at {LWS_CRD} (../shared/schemas is not checked out)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 1.3 MB of YAML: libyaml if built
    crd = yaml.load(LWS_CRD.read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_closed(version["schema"]["openAPIV3Schema"]))


def lws_errors(obj: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in lws_validator().iter_errors(obj)
    ]


def validate_lws(obj: dict[str, Any]) -> None:
    assert lws_errors(obj) == []
    # What the CRD leaves open, checked as core objects: the metadata, and each pod template
    # as the PodTemplateSpec the LWS controller puts into its StatefulSets.
    validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    lwt = obj["spec"]["leaderWorkerTemplate"]
    for which in ("leaderTemplate", "workerTemplate"):
        validate_core(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{obj['metadata']['name']}-{which.lower()}"},
                "template": lwt[which],
            }
        )


# -- placements from the real allocator ------------------------------------------------------


def h200_placement() -> Placement:
    inv = load_inventory(EXAMPLES / "local.yaml")
    got = allocate(inv.nodes, ShapeRequest(sku="H200", gpus_per_engine=2))
    assert isinstance(got, Placement)
    return got


def gb200_placement() -> Placement:
    inv = load_inventory(EXAMPLES / "gb200-nvl72.yaml")
    shape = ShapeRequest(sku="GB200", gpus_per_engine=16, nodes_per_engine=4, engine_level="clique")
    got = allocate(inv.nodes, shape)
    assert isinstance(got, Placement)
    return got


def h200_workload(**kw: Any) -> EngineWorkload:
    return EngineWorkload.from_placement(
        h200_placement().for_role("candidate"),
        namespace="llm-gate",
        gate_id=GATE_ID,
        image="vllm/vllm-openai:v0.11.0",
        model="meta-llama/Llama-3.1-8B-Instruct",
        args=("--model", "{model}", "--port", "{port}", "--tensor-parallel-size", "{tp}"),
        env={"HF_HOME": "/models"},
        secret_env={"HF_TOKEN": ("hf", "token")},
        **kw,
    )


def gb200_workload(**kw: Any) -> EngineWorkload:
    return EngineWorkload.from_placement(
        gb200_placement().for_role("reference"),
        namespace="llm-gate",
        gate_id=GATE_ID,
        image="lmsysorg/sglang:v0.5.0",
        model="deepseek-ai/DeepSeek-R1",
        command=SGLANG_ARGS,
        cpu="32",
        memory="512Gi",
        **kw,
    )


def pod_specs(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Pod":
        return [workload["spec"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]


def hostnames(spec: dict[str, Any]) -> list[str]:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    (expr,) = term["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("kubernetes.io/hostname", "In")
    return list(expr["values"])


# -- tests -----------------------------------------------------------------------------------


def test_lease_is_valid_and_named_after_the_gate() -> None:
    lease = render_lease(
        namespace="llm-gate", gate_id=GATE_ID, holder="gate", duration_s=60, now=NOW
    )
    validate_core(lease)
    assert lease["metadata"]["name"] == lease_name(GATE_ID) == f"gate-{GATE_ID}"
    assert lease["metadata"]["labels"][MANAGED_BY_LABEL] == "llm-deploy-gate"
    assert lease["spec"]["renewTime"] == "2025-06-01T12:00:00.123456Z"
    # The official model parses it back (MicroTime), as the client does before sending.
    assert client.V1Lease.from_dict(lease) is not None


def test_single_node_h200_is_a_pinned_pod_and_a_service() -> None:
    cfg = h200_workload()
    placement = h200_placement().for_role("candidate")
    m = render_engine(cfg, lease=lease_name(GATE_ID), lease_uid=LEASE_UID)
    assert m.compute_domain is None
    assert [o["kind"] for o in m.objects] == ["Service", "Pod"]
    for obj in m.objects:
        validate_core(obj)
        meta = obj["metadata"]
        assert meta["namespace"] == "llm-gate"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": f"gate-{GATE_ID}",
                "uid": LEASE_UID,
            }
        ]
        labels = meta["labels"]
        assert labels[MANAGED_BY_LABEL] == "llm-deploy-gate"
        assert (labels[GATE_ID_LABEL], labels[ROLE_LABEL]) == (GATE_ID, "candidate")

    pod = m.workload
    assert (
        pod["metadata"]["name"]
        == engine_name(GATE_ID, "candidate")
        == "gate-eb0e97fce58b-candidate"
    )
    spec = pod["spec"]
    assert hostnames(spec) == [placement.node] == ["local-h200-0"]
    assert "nodeSelector" not in spec  # no clique on a single H200 host
    assert spec["restartPolicy"] == "Always"
    (c,) = spec["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert "command" not in c  # the image's entrypoint, our args
    assert c["args"] == [
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
    ]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c[
        "env"
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]

    svc = m.service
    assert svc["metadata"]["name"] == "gate-eb0e97fce58b-candidate-http"
    assert svc["spec"]["selector"] == pod["metadata"]["labels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert pod_selector(GATE_ID, "candidate") == (
        f"app.kubernetes.io/managed-by=llm-deploy-gate,gate.dev/gate-id={GATE_ID},"
        "gate.dev/role=candidate"
    )


def test_multi_node_gb200_is_a_leader_worker_set_in_the_clique() -> None:
    placement = gb200_placement().for_role("reference")
    # Best fit: the tighter of the two racks' cliques, named by its label value.
    assert placement.domain == "dfw-1/clique=7f3a.1"
    cfg = gb200_workload()
    assert cfg.clique == "7f3a.1" and cfg.gpus_per_node == 4 and len(cfg.nodes) == 4
    m = render_engine(cfg, lease=lease_name(GATE_ID), lease_uid=LEASE_UID)
    assert [o["kind"] for o in m.objects] == ["ComputeDomain", "Service", "LeaderWorkerSet"]

    lws = m.workload
    validate_lws(lws)
    validate_core(m.service)
    assert m.compute_domain is not None
    assert (
        list(jsonschema.Draft7Validator(COMPUTE_DOMAIN_SCHEMA).iter_errors(m.compute_domain)) == []
    )
    validate_core(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m.compute_domain["metadata"]}
    )
    for obj in m.objects:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == LEASE_UID

    spec = lws["spec"]
    assert spec["replicas"] == 1
    assert spec["startupPolicy"] == "LeaderCreated"
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 4
    assert lwt["restartPolicy"] == "None"
    leader, worker = lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]
    nodes = [n for n, _ in placement.nodes]
    assert hostnames(leader) == nodes[:1]
    assert hostnames(worker) == nodes[1:]
    claim = f"{engine_name(GATE_ID, 'reference')}-imex-channel"
    assert m.compute_domain["spec"] == {
        "numNodes": 4,
        "channel": {"resourceClaimTemplate": {"name": claim}, "allocationMode": "Single"},
    }
    for pod_spec in (leader, worker):
        assert pod_spec["nodeSelector"] == {CLIQUE: "7f3a.1"}
        anti = pod_spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
        assert pod_spec["resourceClaims"] == [
            {"name": "imex-channel", "resourceClaimTemplateName": claim}
        ]
        (c,) = pod_spec["containers"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "memory": "512Gi"}
        assert c["resources"]["claims"] == [{"name": "imex-channel"}]
        assert c["command"][c["command"].index("--tp") + 1] == "16"
        assert "$(LWS_LEADER_ADDRESS):20000" in c["command"]
    # Only the leader serves HTTP, so only it has the port and the readiness probe.
    assert "readinessProbe" in leader["containers"][0]
    assert "readinessProbe" not in worker["containers"][0]
    assert lwt["leaderTemplate"]["metadata"]["labels"]["gate.dev/component"] == "leader"
    assert m.service["spec"]["selector"]["gate.dev/component"] == "leader"


def test_single_node_gb200_is_pinned_to_the_clique_without_a_compute_domain() -> None:
    cfg = EngineWorkload(
        namespace="llm-gate",
        gate_id=GATE_ID,
        role="candidate",
        image="vllm/vllm-openai:v0.11.0",
        model="m",
        nodes=("gb-r0-h05",),
        gpus_per_node=4,
        args=("--model", "{model}"),
        clique="7f3a.0",
    )
    m = render_engine(cfg, lease="l", lease_uid=LEASE_UID)
    assert m.compute_domain is None  # NVLink inside one host needs no IMEX channel
    validate_core(m.workload)
    assert m.workload["spec"]["nodeSelector"] == {CLIQUE: "7f3a.0"}
    assert "resourceClaims" not in m.workload["spec"]


def test_the_crd_schema_rejects_what_the_api_server_would() -> None:
    lws = render_engine(gb200_workload(), lease="l", lease_uid=LEASE_UID).workload
    bad_enum = copy.deepcopy(lws)
    bad_enum["spec"]["startupPolicy"] = "WhenReady"
    unknown = copy.deepcopy(lws)
    unknown["spec"]["leaderWorkerTemplate"]["groupSize"] = 4
    wrong_type = copy.deepcopy(lws)
    wrong_type["spec"]["leaderWorkerTemplate"]["size"] = "4"
    bad_container = copy.deepcopy(lws)
    bad_container["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "cmd"
    ] = ["x"]
    assert any("startupPolicy" in e for e in lws_errors(bad_enum))
    assert any("groupSize" in e for e in lws_errors(unknown))
    assert any("size" in e for e in lws_errors(wrong_type))
    assert any("cmd" in e for e in lws_errors(bad_container))


def test_manifests_survive_the_official_models_unchanged() -> None:
    """The launcher sends core objects as the client's models: nothing may be lost on the way."""
    api = client.ApiClient()
    for cfg in (h200_workload(), gb200_workload()):
        m = render_engine(cfg, lease="l", lease_uid=LEASE_UID)
        for obj in m.objects:
            if obj["kind"] == "Pod":
                assert api.sanitize_for_serialization(client.V1Pod.from_dict(obj)) == obj
            elif obj["kind"] == "Service":
                assert api.sanitize_for_serialization(client.V1Service.from_dict(obj)) == obj


@pytest.mark.parametrize(
    ("field", "argv"),
    [
        ("command", ("sh", "-c", "vllm serve m --port 8000")),
        ("command", ("/bin/bash", "-lc", "ray start --head && vllm serve m")),
        ("command", ("vllm serve m",)),
        ("worker_command", ("bash", "-c", "ray start --block")),
    ],
)
def test_shell_strings_are_rejected(field: str, argv: tuple[str, ...]) -> None:
    base: dict[str, Any] = {"command": ("vllm", "serve", "m")}
    with pytest.raises(ValueError, match=r"argv|command line"):
        EngineWorkload(
            namespace="ns",
            gate_id=GATE_ID,
            role="candidate",
            image="img",
            model="m",
            nodes=("n0", "n1"),
            gpus_per_node=1,
            **{**base, field: argv},
        )


def test_no_rendered_container_runs_a_shell() -> None:
    for cfg in (h200_workload(), gb200_workload()):
        m = render_engine(cfg, lease="l", lease_uid=LEASE_UID)
        for spec in pod_specs(m.workload):
            for c in spec["containers"]:
                argv = [*c.get("command", []), *c.get("args", [])]
                assert argv and all(isinstance(a, str) for a in argv)
                assert argv[0].rsplit("/", 1)[-1] not in {"sh", "bash"}
                assert "-c" not in argv


@pytest.mark.parametrize(
    "kw",
    [
        {"nodes": ()},
        {"nodes": ("a", "a")},
        {"gpus_per_node": 0},
        {"namespace": "Bad_NS"},
        {"port": 0},
        {"command": (), "args": ()},
        {"env": {"BAD NAME": "x"}},
    ],
)
def test_bad_configs_are_refused(kw: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "namespace": "ns",
        "gate_id": GATE_ID,
        "role": "candidate",
        "image": "img",
        "model": "m",
        "nodes": ("n0",),
        "gpus_per_node": 1,
        "command": ("serve",),
    }
    with pytest.raises(ValueError):
        EngineWorkload(**{**base, **kw})


def test_names_fit_kubernetes_limits() -> None:
    long_id = "a" * 63
    assert len(lease_name(long_id)) <= 63
    assert len(engine_name(long_id, "candidate")) <= 40  # room for LWS's `-0-17` and hashes
    assert engine_name("EB0E_97fc", "Candidate") == "gate-eb0e-97fc-candidate"
    assert clique_of("dfw-1/clique=7f3a.0") == "7f3a.0"
    assert clique_of("local-h200-0") is None
    assert clique_of("dfw-1/block=b0") is None


# -- engines of several worker groups -------------------------------------------------------

KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'  # braces that are no placeholder


def pd_kubernetes(**kw: Any) -> KubernetesSpec:
    return KubernetesSpec(
        image="vllm/vllm-openai:v0.11.0",
        namespace="llm-gate",
        command=["vllm", "serve", "{model}"],
        args=["--port", "{port}", "--tensor-parallel-size", "{tp}"],
        env={"VLLM_LOGGING_LEVEL": "INFO"},
        groups={
            "prefill": KubernetesGroupSpec(
                args=["--port", "{port}", "--kv-transfer-config", KV], env={"ROLE": "{role}"}
            ),
            "decode": KubernetesGroupSpec(
                command=["python3", "-m", "sglang.launch_server"],
                args=["--tp", "{total_gpus}", "--node-rank", "$(LWS_WORKER_INDEX)"],
            ),
        },
        router=KubernetesRouterSpec(
            image="lmsysorg/sglang-router:v0.2.0",
            command=["python3", "-m", "sglang_router.launch_router"],
            args=["--prefill", "{url:prefill}", "--decode", "{url:decode}", "--port", "{port}"],
        ),
        **kw,
    )


def pd_placement() -> EnginePlacement:
    """Prefill on two GPUs of one H200 node; decode on two GB200 nodes of one clique."""
    groups = (
        GroupPlacement("prefill", ("h200-a",), ((4, 5),), "NVIDIA-H200", "dfw-1/host=h200-a"),
        GroupPlacement(
            "decode",
            ("gb-r0-h00", "gb-r0-h01"),
            ((0, 1, 2, 3), (0, 1, 2, 3)),
            "NVIDIA-GB200",
            "dfw-1/clique=7f3a.0",
        ),
    )
    nodes = tuple((n, g) for gp in groups for n, g in gp.workers)
    return EnginePlacement("candidate", nodes, "NVIDIA-H200", "dfw-1", groups)


def test_a_grouped_engine_renders_one_workload_per_group_and_a_router() -> None:
    groups, router = group_workloads(GATE_ID, "m", "candidate", pd_kubernetes(), pd_placement())
    assert list(groups) == ["prefill", "decode"]
    rendered = {
        name: render_engine(w, lease="gate-x", lease_uid=LEASE_UID)
        for name, w in [*groups.items(), ("router", router)]
    }
    base = engine_name(GATE_ID, "candidate")
    for name, made in rendered.items():
        assert made.workload["metadata"]["name"] == f"{base}-{name}"
        assert made.service["metadata"]["name"] == f"{base}-{name}-http"
        for obj in made.objects:
            meta = obj["metadata"]
            assert len(meta["name"]) <= 63 and meta["ownerReferences"][0]["uid"] == LEASE_UID
            assert meta["labels"]["gate.dev/group"] == name
            if obj["kind"] == "LeaderWorkerSet":
                validate_lws(obj)
            elif obj["kind"] == "ComputeDomain":
                jsonschema.validate(obj, COMPUTE_DOMAIN_SCHEMA)
            else:
                validate_core(obj)
    # prefill: a Pod on its node, its own argv and two GPUs; the engine's command kept.
    pod = rendered["prefill"].workload
    assert pod["kind"] == "Pod" and rendered["prefill"].compute_domain is None
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["vllm", "serve", "m"]
    assert c["args"] == ["--port", "8000", "--kv-transfer-config", KV]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert {"name": "ROLE", "value": "{role}"} in c["env"]  # env is never a template
    assert pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["h200-a"]
    # decode: a LeaderWorkerSet across its clique's two nodes, with its ComputeDomain.
    lws = rendered["decode"].workload
    assert lws["kind"] == "LeaderWorkerSet"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert leader["nodeSelector"] == {CLIQUE: "7f3a.0"}
    assert leader["containers"][0]["args"] == ["--tp", "8", "--node-rank", "$(LWS_WORKER_INDEX)"]
    cd = rendered["decode"].compute_domain
    assert cd is not None and cd["metadata"]["name"] == f"{base}-decode-imex"
    # the router: no GPUs, on the first group's leader node, given every group's Service.
    rp = rendered["router"].workload
    rc = rp["spec"]["containers"][0]
    assert rc["image"] == "lmsysorg/sglang-router:v0.2.0"
    assert "limits" not in rc.get("resources", {}) and "nodeSelector" not in rp["spec"]
    assert rc["args"] == [
        "--prefill",
        f"http://{base}-prefill-http.llm-gate.svc:8000",
        "--decode",
        f"http://{base}-decode-http.llm-gate.svc:8000",
        "--port",
        "8000",
    ]
    assert rendered["router"].service["spec"]["selector"]["gate.dev/group"] == "router"
    # Each group's pods are selected apart from the other's (polls, anti-affinity).
    assert groups["decode"].selector.endswith("gate.dev/group=decode")
    anti = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["affinity"]
    terms = anti["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["labelSelector"]["matchLabels"]["gate.dev/group"] == "decode"


def test_group_names_stay_within_kubernetes_limits() -> None:
    long = engine_name("a" * 63, "candidate", "abcdefghijklmnop")
    assert len(long) <= 44 and len(f"{long}-imex-channel") <= 63
    with pytest.raises(ValueError, match="only for a router"):
        EngineWorkload(
            namespace="ns",
            gate_id=GATE_ID,
            role="candidate",
            group="decode",
            image="img",
            model="m",
            nodes=("n0",),
            gpus_per_node=0,
            command=("serve",),
        )
