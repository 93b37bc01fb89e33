"""Kubernetes launcher: an engine as pods on the nodes the gate reserved, behind the `Engine`
protocol of `gate.engines.launchers`, so the gate run service drives it like a local process.

Lifecycle on the gate's monotonic clock: `launched` (the objects were created), `pods_scheduled`
(every pod has a node), `image_pulled` (every container is past ContainerCreating), `started`
(every container runs), then `port_open`, `healthy` and `model_listed` through the engine's
Service, walked by `readiness.wait_ready`. Phases are marked when a poll sees them (every
`poll_s`), not back-dated from pod timestamps: those are the API server's wall clock, the phases
are the gate's monotonic one, and the error is bounded by the poll period. A readiness timeout
names the phase it stuck in and what the pods said there (e.g. the scheduler's "0/10 nodes are
available: ..."); an image pull failure (ErrImagePull, ImagePullBackOff, InvalidImageName) ends
the start at once, naming the image and the reason, since waiting cannot fix a wrong tag.

During load, a background task lists the engine's pods every `poll_s` (1 s by default), so
`crashed()` stays a synchronous attribute read. A crash is a container restart (restartCount
above zero, with lastState.terminated's reason and exit code: OOMKilled, Error, 137...), a
container that terminated, a pod that failed (Evicted) or is being deleted, a pod that vanished
or was replaced (new uid), or the gate's Lease deleted behind its back. The log tail of a crash
is the *previous* container's log, which is the one that says why.

Teardown (`stop`): the leader's log tail is kept for the report, then the engine's objects are
deleted explicitly (Background propagation, 404 tolerated), the gate Lease is released (deleted
with Background propagation once no engine holds it), and the pods are awaited until gone (up to
`stop_wait_s`) so the GPUs are free before the gate releases its reservation. This runs for
every object whose creation was attempted, so it also cleans up a start that failed halfway.
`kill_now` does the same synchronously, without waiting. A gate that dies without either stops
renewing its Lease; `reap_expired_leases` (gate/reservations/kubernetes.py) deletes expired
gate Leases and the garbage collector removes everything they own.

How a gate uses it: at reservation, `gate.reservations.kubernetes.gate_inventory` connects
(kubeconfig or in-cluster), reaps the expired Leases of dead gates and reads the nodes (unless
the spec names an inventory file); at launch (`gate/runs/kubernetes_kind.py`), one
`GateLease` per gate and namespace, shared by both engines, and per role
`KubernetesEngine(EngineWorkload.from_placement(placement.for_role(role), ...), phases,
api_client, lease=gate_lease)`. The base URL is `http://<engine>-http.<namespace>.svc:<port>`
(reachable from inside the cluster); `base_url_override` points it elsewhere (a port-forward, a
test server). RBAC the gate's service account needs in the namespace: leases (create, get,
list, patch, delete), pods (create, get, list, delete), pods/log (get), services (create,
delete), leaderworkersets and computedomains (create, delete); cluster-wide, for the
inventory: nodes and pods (list).

What was run and what was not. Run here: every API call through the official `kubernetes`
client (its models, serialisation and REST layer) against `tests/support/k8s_fake.py`, a
stateful fake API server (objects created by POST are visible to GET/list, DELETE cascades
along ownerReferences like the garbage collector, tests advance pod status and play the LWS
controller); core objects validated with `kubernetes-validate` (Kubernetes 1.37, strict), the
LeaderWorkerSet with the CRD's own openAPIV3Schema, the ComputeDomain against a minimal schema
from the NVIDIA DRA driver's CRD; readiness against a real local HTTP server; and whole gates
(`tests/gate/runs/test_kubernetes_gate.py`: kubeconfig loading, cluster inventory, reaping, the
load to real sim engine processes behind `base_url_override`, crash and timeout holds). Not
run: no real API server, kubelet, scheduler, LWS controller, DRA driver or GPU; so admission
webhooks, RBAC, real scheduling and pulls, DNS of the Service, and IMEX channels are untested
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gate.core.errors import ClusterError as ClusterError  # it lived here: re-exported
from gate.core.errors import EngineError, ReadinessTimeout
from gate.engines.describe import engine_doc
from gate.engines.lifecycle import CrashInfo, PhaseLog
from gate.engines.manifests import (
    CD_GROUP,
    CD_PLURAL,
    CD_VERSION,
    COMPONENT_LABEL,
    CONTAINER,
    LWS_GROUP,
    LWS_PLURAL,
    LWS_VERSION,
    MANAGER,
    EngineManifests,
    EngineWorkload,
    Manifest,
    dns_part,
    lease_name,
    micro_time,
    render_engine,
    render_lease,
)
from gate.engines.readiness import wait_ready
from gate.reservations.kubernetes import api_reason, transient_errors
from gate.verdict.document import EngineDoc, KubernetesDoc, PlacementDoc

if TYPE_CHECKING:
    from gate.engines.launchers import Engine

log = logging.getLogger(__name__)

KUBERNETES_PHASES = (
    "launched",
    "pods_scheduled",
    "image_pulled",
    "started",
    "port_open",
    "healthy",
    "model_listed",
)
PULL_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
CREATING = frozenset({"ContainerCreating", "PodInitializing"})
START_FAILURES = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "StartError"}
)
CRASH_LOG_LINES = 20
KEEP_LOG_LINES = 200
CUSTOM_KINDS = {
    "LeaderWorkerSet": (LWS_GROUP, LWS_VERSION, LWS_PLURAL),
    "ComputeDomain": (CD_GROUP, CD_VERSION, CD_PLURAL),
}
# What a poll or a delete can meet besides an API answer: a dropped connection, a timeout.
TRANSIENT = transient_errors()


# -- what the pods say (pure) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    image: str
    restarts: int = 0
    image_id: str | None = None  # the kubelet's imageID: the digest it runs, once pulled
    waiting: str | None = None
    waiting_message: str | None = None
    running: bool = False
    terminated: str | None = None
    exit_code: int | None = None
    last_terminated: str | None = None
    last_exit_code: int | None = None

    @property
    def pulled(self) -> bool:
        """Past image pull: running, ended, restarted, or waiting for something else
        (CrashLoopBackOff also means the image is there)."""
        if self.running or self.terminated is not None or self.restarts > 0:
            return True
        return self.waiting is not None and self.waiting not in CREATING | PULL_FAILURES


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    uid: str
    component: str | None = None
    node: str | None = None
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    unschedulable: str | None = None
    deleting: bool = False
    containers: tuple[ContainerView, ...] = ()


def _container_view(status: client.V1ContainerStatus) -> ContainerView:
    state, last = status.state, status.last_state
    waiting = state.waiting if state else None
    terminated = state.terminated if state else None
    last_terminated = last.terminated if last else None
    return ContainerView(
        name=status.name,
        image=status.image,
        image_id=status.image_id or None,
        restarts=status.restart_count,
        waiting=(waiting.reason or "Waiting") if waiting else None,
        waiting_message=waiting.message if waiting else None,
        running=bool(state and state.running),
        terminated=(terminated.reason or "Terminated") if terminated else None,
        exit_code=terminated.exit_code if terminated else None,
        last_terminated=(last_terminated.reason or "Terminated") if last_terminated else None,
        last_exit_code=last_terminated.exit_code if last_terminated else None,
    )


def pod_view(pod: client.V1Pod) -> PodView:
    meta = pod.metadata or client.V1ObjectMeta()
    status = pod.status or client.V1PodStatus()
    unschedulable = None
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            unschedulable = f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".strip()
    return PodView(
        name=meta.name or "",
        uid=meta.uid or "",
        component=(meta.labels or {}).get(COMPONENT_LABEL),
        node=pod.spec.node_name if pod.spec else None,
        phase=status.phase,
        reason=status.reason,
        message=status.message,
        unschedulable=unschedulable,
        deleting=meta.deletion_timestamp is not None,
        containers=tuple(_container_view(c) for c in status.container_statuses or []),
    )


@dataclass(frozen=True, slots=True)
class CrashEvidence:
    description: str
    exit_code: int | None
    pod: str | None
    previous: bool  # the previous container instance's log says why


def _ended(reason: str | None, code: int | None) -> str:
    return f"{reason or 'Terminated'}" + (f", exit code {code}" if code is not None else "")


def find_crash(pods: Sequence[PodView], seen: Mapping[str, str]) -> CrashEvidence | None:
    """The first sign that an engine that was up is not any more; `seen` maps each pod name
    ever observed to its uid, so a pod that vanished or was replaced counts too."""
    by_name = {p.name: p for p in pods}
    for name, uid in seen.items():
        now = by_name.get(name)
        if now is None or now.uid != uid:
            what = "disappeared" if now is None else "was replaced by a new pod"
            return CrashEvidence(f"pod {name} {what}", None, None, False)
    for p in pods:
        for c in p.containers:
            if c.restarts > 0:
                why = _ended(c.last_terminated, c.last_exit_code)
                return CrashEvidence(
                    f"container {c.name} in pod {p.name} restarted ({why}; {c.restarts} restarts)",
                    c.last_exit_code,
                    p.name,
                    True,
                )
            if c.terminated is not None:
                why = _ended(c.terminated, c.exit_code)
                return CrashEvidence(
                    f"container {c.name} in pod {p.name} exited ({why})", c.exit_code, p.name, False
                )
        if p.phase in ("Failed", "Succeeded"):
            why = ": ".join(x for x in (p.reason, p.message) if x) or p.phase
            return CrashEvidence(f"pod {p.name} ended ({p.phase}: {why})", None, p.name, False)
        if p.deleting:
            return CrashEvidence(f"pod {p.name} is being deleted", None, p.name, False)
    return None


def all_scheduled(pods: Sequence[PodView], expected: int) -> bool:
    return len(pods) >= expected and all(p.node for p in pods)


def all_pulled(pods: Sequence[PodView], expected: int) -> bool:
    return (
        len(pods) >= expected
        and all(p.containers for p in pods)
        and all(c.pulled for p in pods for c in p.containers)
    )


def all_running(pods: Sequence[PodView], expected: int) -> bool:
    return (
        len(pods) >= expected
        and all(p.containers for p in pods)
        and all(c.running for p in pods for c in p.containers)
    )


def _first_waiting(
    pods: Sequence[PodView], reasons: frozenset[str]
) -> tuple[PodView, ContainerView, str] | None:
    """The first container waiting for one of `reasons`, with its pod and why it waits."""
    for p in pods:
        for c in p.containers:
            if c.waiting in reasons:
                msg = f": {c.waiting_message}" if c.waiting_message else ""
                return p, c, f"{c.waiting}{msg}"
    return None


def pull_failure(pods: Sequence[PodView]) -> str | None:
    if (found := _first_waiting(pods, PULL_FAILURES)) is None:
        return None
    p, c, why = found
    return f"could not pull image {c.image} for pod {p.name} ({why})"


def start_failure(pods: Sequence[PodView]) -> str | None:
    if (found := _first_waiting(pods, START_FAILURES)) is None:
        return None
    p, c, why = found
    return f"could not start container {c.name} in pod {p.name} ({why})"


def stuck_detail(pods: Sequence[PodView], expected: int, phase: str) -> str:
    """What the pods say about the phase they are stuck in, for the timeout's message."""
    if len(pods) < expected:
        return f"{len(pods)}/{expected} pods exist"
    if phase == "pods_scheduled":
        for p in pods:
            if not p.node and p.unschedulable:
                return f"pod {p.name}: {p.unschedulable}"
        done = sum(1 for p in pods if p.node)
        return f"{done}/{expected} pods scheduled"
    for p in pods:
        if not p.containers:
            return f"pod {p.name}: no container status yet"
        for c in p.containers:
            if not c.running:
                msg = f": {c.waiting_message}" if c.waiting_message else ""
                return f"pod {p.name} container {c.name}: {c.waiting or 'not running'}{msg}"
    return ""


# -- the API, as this launcher uses it -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def _ref(manifest: Manifest) -> ObjectRef:
    meta = manifest["metadata"]
    return ObjectRef(str(manifest["kind"]), str(meta["namespace"]), str(meta["name"]))


class KubeApi:
    """The three typed APIs behind one small surface; every call is synchronous (run it in a
    thread from async code) and bounded by `timeout_s`."""

    def __init__(self, api_client: client.ApiClient, timeout_s: float = 10.0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout_s = timeout_s

    def create(self, manifest: Manifest) -> str:
        """Create one object; returns its uid."""
        ref, t = _ref(manifest), self.timeout_s
        if ref.kind == "Pod":
            pod = client.V1Pod.from_dict(manifest)
            assert pod is not None
            return _uid(self.core.create_namespaced_pod(ref.namespace, pod, _request_timeout=t))
        if ref.kind == "Service":
            svc = client.V1Service.from_dict(manifest)
            assert svc is not None
            made = self.core.create_namespaced_service(ref.namespace, svc, _request_timeout=t)
            return _uid(made)
        if ref.kind == "Lease":
            lease = client.V1Lease.from_dict(manifest)
            assert lease is not None
            made_lease = self.coordination.create_namespaced_lease(
                ref.namespace, lease, _request_timeout=t
            )
            return _uid(made_lease)
        group, version, plural = CUSTOM_KINDS[ref.kind]
        obj = self.custom.create_namespaced_custom_object(
            group, version, ref.namespace, plural, manifest, _request_timeout=t
        )
        meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
        return str(meta.get("uid", ""))

    def delete(self, ref: ObjectRef, timeout_s: float | None = None) -> bool:
        """Delete with Background propagation; False when it was already gone."""
        t = timeout_s or self.timeout_s
        opts = client.V1DeleteOptions(propagation_policy="Background")
        try:
            if ref.kind == "Pod":
                self.core.delete_namespaced_pod(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            elif ref.kind == "Service":
                self.core.delete_namespaced_service(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            elif ref.kind == "Lease":
                self.coordination.delete_namespaced_lease(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            else:
                group, version, plural = CUSTOM_KINDS[ref.kind]
                self.custom.delete_namespaced_custom_object(
                    group, version, ref.namespace, plural, ref.name, body=opts, _request_timeout=t
                )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def lease_uid(self, namespace: str, name: str) -> str:
        return _uid(
            self.coordination.read_namespaced_lease(
                name, namespace, _request_timeout=self.timeout_s
            )
        )

    def renew_lease(self, namespace: str, name: str, at: datetime) -> None:
        body = {"spec": {"renewTime": micro_time(at)}}
        self.coordination.patch_namespaced_lease(
            name, namespace, body, _request_timeout=self.timeout_s
        )

    def list_pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=self.timeout_s
        )
        return list(pods.items)

    def pod_log(
        self, namespace: str, pod: str, lines: int, *, previous: bool = False, timeout_s: float = 0
    ) -> list[str]:
        text = self.core.read_namespaced_pod_log(
            pod,
            namespace,
            container=CONTAINER,
            tail_lines=lines,
            previous=previous,
            _request_timeout=timeout_s or self.timeout_s,
        )
        return str(text or "").splitlines()[-lines:]


def _uid(obj: Any) -> str:
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, "uid", None) or "")


# -- the gate's Lease ----------------------------------------------------------------------------


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task (a lease renewer, a pod watcher) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class GateLease:
    """The Lease that owns every object of one gate, shared by its engines.

    The first `acquire` creates it (or adopts one of the same name: a retry of the same gate)
    and starts renewing it every `renew_every_s`; each engine's `release` counts down, and the
    last one deletes it with Background propagation, which lets the garbage collector remove
    whatever the explicit deletes missed. renewTime is wall-clock time by the Lease's
    definition: it is compared with other machines' clocks by `reap_expired_leases`.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        gate_id: str,
        holder: str | None = None,
        duration_s: int = 60,
        renew_every_s: float | None = None,
        name: str | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.api = KubeApi(api_client, request_timeout_s)
        self.namespace = namespace
        self.gate_id = gate_id
        self.name = name or lease_name(gate_id)
        self.holder = holder or f"{MANAGER}/{gate_id}"
        self.duration_s = duration_s
        self.renew_every_s = renew_every_s if renew_every_s is not None else duration_s / 3
        self.uid: str | None = None
        self.lost: str | None = None  # why the Lease is gone while held, if it is
        self._holders = 0
        self._attempted = False
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Lease", self.namespace, self.name)

    async def acquire(self) -> str:
        """The Lease's uid, for ownerReferences. Counts a holder even when it fails, so the
        caller's `release` (always called) still deletes a Lease created before the failure."""
        self._holders += 1
        async with self._lock:
            if self.uid is None:
                self._attempted = True
                manifest = render_lease(
                    namespace=self.namespace,
                    gate_id=self.gate_id,
                    holder=self.holder,
                    duration_s=self.duration_s,
                    now=datetime.now(UTC),
                    name=self.name,
                )
                try:
                    uid = await asyncio.to_thread(self.api.create, manifest)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    uid = await asyncio.to_thread(self.api.lease_uid, self.namespace, self.name)
                self.uid = uid
                self.lost = None
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.create_task(self._renew())
            return self.uid

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await asyncio.to_thread(
                    self.api.renew_lease, self.namespace, self.name, datetime.now(UTC)
                )
            except ApiException as exc:
                if exc.status == 404:
                    self.lost = f"the gate's Lease {self.namespace}/{self.name} was deleted"
                    return
                log.warning("renewing Lease %s failed: %s", self.name, api_reason(exc))
            except TRANSIENT as exc:
                log.warning("renewing Lease %s failed: %s", self.name, api_reason(exc))

    async def _stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        await _cancel(task)

    async def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders:
            return
        await self._stop_renewing()
        if self._attempted:
            await asyncio.to_thread(self.api.delete, self.ref)
            self._attempted = False
            self.uid = None

    def kill_now(self) -> None:
        """Synchronous last resort: delete the Lease whoever still holds it."""
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        if self._attempted:
            with contextlib.suppress(*TRANSIENT):
                self.api.delete(self.ref, timeout_s=5)
            self._attempted = False
            self.uid = None
        self._holders = 0


# -- the engine ----------------------------------------------------------------------------------


@dataclass
class KubernetesEngine:
    """One engine as pods; see the module docstring for the lifecycle and teardown."""

    workload: EngineWorkload
    phases: PhaseLog
    api_client: client.ApiClient
    lease: GateLease | None = None
    readiness_timeout_s: float = 1800.0
    poll_s: float = 1.0
    stop_wait_s: float = 60.0
    base_url_override: str | None = None
    cluster_domain: str | None = None
    request_timeout_s: float = 10.0
    role: str = field(init=False)
    base_url: str = field(init=False)
    pid: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        w = self.workload
        self.role = w.role
        self.service_url = w.service_url(self.cluster_domain)
        self.base_url = self.base_url_override or self.service_url
        self._api = KubeApi(self.api_client, self.request_timeout_s)
        if self.lease is None:
            # Standalone: a Lease of its own, so stopping it never takes another engine along.
            self.lease = GateLease(
                self.api_client,
                namespace=w.namespace,
                gate_id=w.gate_id,
                name=f"{lease_name(w.gate_id)}-{dns_part(w.role)}",
                request_timeout_s=self.request_timeout_s,
            )
        self._gate_lease: GateLease = self.lease
        self.manifests: EngineManifests | None = None
        self._created: list[ObjectRef] = []  # creation attempted, in order; deleted on stop
        self._lease_held = False
        self._pods: list[PodView] = []
        self._seen: dict[str, str] = {}
        self._poll_error: str | None = None
        self._crash: CrashInfo | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopped = False
        self._final_log: list[str] | None = None

    @property
    def launched(self) -> bool:
        return True

    @property
    def image_digest(self) -> str | None:
        """The imageID the kubelet reported for the leader's first container (the test bed's
        record: a tag can move, the digest does not)."""
        for p in self._pods:
            for c in p.containers:
                if c.image_id:
                    return c.image_id
        return None

    @property
    def expected_pods(self) -> int:
        return len(self.workload.nodes)

    # -- start ---------------------------------------------------------------------------------

    async def start(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.readiness_timeout_s
        try:
            await self._launch()
            await self._walk_pods(deadline)
            self._watcher = asyncio.create_task(self._watch())
            await self._wait_served(deadline)
        except BaseException:
            if self._watcher is not None:
                self._watcher.cancel()  # stop() awaits it
            raise

    async def _launch(self) -> None:
        w = self.workload
        self._lease_held = True  # before awaiting: stop() must release even if cancelled here
        try:
            uid = await self._gate_lease.acquire()
        except TRANSIENT as exc:
            lease = self._gate_lease.ref
            raise EngineError(
                self.role, "launched", f"could not create {lease}: {api_reason(exc)}"
            ) from None
        self.manifests = render_engine(w, lease=self._gate_lease.name, lease_uid=uid)
        for manifest in self.manifests.objects:
            ref = _ref(manifest)
            self._created.append(ref)  # the intent: a create that timed out may still exist
            try:
                await asyncio.to_thread(self._api.create, manifest)
            except TRANSIENT as exc:
                raise EngineError(
                    self.role, "launched", f"could not create {ref}: {api_reason(exc)}"
                ) from None
        kind = self.manifests.workload["kind"]
        self.phases.mark(
            "launched", f"{kind} {w.namespace}/{w.name} on {', '.join(w.nodes)} ({w.image})"
        )

    async def _walk_pods(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        n = self.expected_pods
        while True:
            await self._poll_once()
            pods = self._pods
            # Each phase a poll shows is marked before a failure it also shows ends the start:
            # one poll can see pods bound to their nodes and already failing to pull.
            reached = self.phases.reached
            if "pods_scheduled" not in reached and all_scheduled(pods, n):
                self.phases.mark("pods_scheduled", ", ".join(f"{p.name}@{p.node}" for p in pods))
            failure = pull_failure(pods)
            if failure is not None:
                raise EngineError(self.role, "image_pulled", f"{failure} during image_pulled")
            if (
                "pods_scheduled" in reached
                and "image_pulled" not in reached
                and all_pulled(pods, n)
            ):
                self.phases.mark("image_pulled", self.workload.image)
            failure = start_failure(pods)
            if failure is not None:
                raise EngineError(self.role, "started", f"{failure} during started")
            if "image_pulled" in reached and "started" not in reached and all_running(pods, n):
                self.phases.mark("started")
            # After marking: a container that crash-loops did pull its image and did start.
            why = self._why_dead()
            if why is not None:
                stuck = self.phases.stuck_in(KUBERNETES_PHASES)
                raise EngineError(self.role, stuck, f"{why} during {stuck}")
            if "started" in reached:
                return
            if loop.time() >= deadline:
                stuck = self.phases.stuck_in(KUBERNETES_PHASES)
                detail = stuck_detail(pods, n, stuck)
                if self._poll_error:
                    detail = f"{detail}; last poll failed: {self._poll_error}".lstrip("; ")
                raise self._timeout(stuck, detail)
            await asyncio.sleep(self.poll_s)

    async def _wait_served(self, deadline: float) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise self._timeout("port_open", "")
        try:
            await wait_ready(
                role=self.role,
                base_url=self.base_url,
                model=self.workload.model,
                phases=self.phases,
                order=KUBERNETES_PHASES,
                timeout_s=remaining,
                alive=self._why_dead,
            )
        except ReadinessTimeout as exc:
            # wait_ready counted from its own start; say the whole budget and keep its detail.
            detail = exc.message.partition(f"stuck in phase {exc.phase}")[2].strip(" ()")
            raise self._timeout(exc.phase, detail) from None

    def _timeout(self, phase: str, detail: str) -> ReadinessTimeout:
        more = f" ({detail})" if detail else ""
        return ReadinessTimeout(
            self.role,
            phase,
            f"was not ready after {self.readiness_timeout_s:g}s: stuck in phase {phase}{more}",
        )

    # -- watching ------------------------------------------------------------------------------

    async def _poll_once(self) -> None:
        ns, selector = self.workload.namespace, self.workload.selector
        try:
            raw = await asyncio.to_thread(self._api.list_pods, ns, selector)
        except TRANSIENT as exc:
            self._poll_error = api_reason(exc)
            return
        self._poll_error = None
        pods = sorted((pod_view(p) for p in raw), key=lambda p: (p.component != "leader", p.name))
        self._pods = pods
        evidence = find_crash(pods, self._seen)
        for p in pods:
            self._seen.setdefault(p.name, p.uid)
        if evidence is None and self._gate_lease.lost:
            evidence = CrashEvidence(self._gate_lease.lost, None, None, False)
        if evidence is not None and self._crash is None and not self._stopped:
            at = self.phases.clock.now_s()
            tail: list[str] = []
            if evidence.pod is not None:
                with contextlib.suppress(Exception):  # evidence is best effort, never a failure
                    tail = await asyncio.to_thread(
                        self._api.pod_log,
                        ns,
                        evidence.pod,
                        CRASH_LOG_LINES,
                        previous=evidence.previous,
                    )
            self._crash = CrashInfo(
                role=self.role,
                at_s=at,
                exit_code=evidence.exit_code,
                description=evidence.description,
                log_tail=tuple(tail),
            )

    async def _watch(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.poll_s)
            await self._poll_once()

    def _why_dead(self) -> str | None:
        return self._crash.description if self._crash is not None else None

    def crashed(self) -> CrashInfo | None:
        if self._stopped:
            return None
        return self._crash

    # -- logs ----------------------------------------------------------------------------------

    def leader_pod(self) -> str:
        for p in self._pods:
            if p.component == "leader":
                return p.name
        # LeaderWorkerSet names the leader of group 0 `<name>-0`; a bare Pod is `<name>`.
        return f"{self.workload.name}-0" if self.workload.multi_node else self.workload.name

    def log_tail(self, lines: int = 40) -> list[str]:
        """The leader's last lines: kept from teardown once stopped, else read now (bounded by
        a short timeout, since the protocol makes this a synchronous call)."""
        if self._final_log is not None:
            return self._final_log[-lines:] if lines > 0 else []
        if not self._created:
            return []
        try:
            return self._api.pod_log(self.workload.namespace, self.leader_pod(), lines, timeout_s=5)
        except Exception:  # a report without logs beats a report that failed
            return []

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        w, made = self.workload, self.manifests
        objects = [] if made is None else made.objects
        kube = KubernetesDoc(
            namespace=w.namespace,
            image=w.image,
            workload=f"{'LeaderWorkerSet' if w.multi_node else 'Pod'} {w.name}",
            clique=w.clique,
            service_url=self.service_url,
            lease=self.lease.name if self.lease else None,
            objects=[f"{m['kind']} {w.namespace}/{m['metadata']['name']}" for m in objects],
        )
        return engine_doc(self, "kubernetes", placement, crash, kubernetes=kube)

    # -- stop ----------------------------------------------------------------------------------

    async def _stop_watching(self) -> None:
        task, self._watcher = self._watcher, None
        await _cancel(task)

    async def stop(self) -> None:
        self._stopped = True
        await self._stop_watching()
        ns = self.workload.namespace
        if self._created and self._final_log is None:
            with contextlib.suppress(Exception):  # a log read must never block teardown
                self._final_log = await asyncio.to_thread(
                    self._api.pod_log, ns, self.leader_pod(), KEEP_LOG_LINES
                )
        workload_created = any(r.kind in ("Pod", "LeaderWorkerSet") for r in self._created)
        problems: list[str] = []
        for ref in list(reversed(self._created)):
            try:
                await asyncio.to_thread(self._api.delete, ref)
            except TRANSIENT as exc:
                problems.append(f"{ref}: {api_reason(exc)}")
                continue
            self._created.remove(ref)
        if self._lease_held:
            self._lease_held = False
            try:
                await self._gate_lease.release()
            except TRANSIENT as exc:
                problems.append(f"{self._gate_lease.ref}: {api_reason(exc)}")
        if workload_created:
            await self._wait_pods_gone()
        if problems:
            raise EngineError(
                self.role, "stopped", "teardown could not delete " + "; ".join(problems)
            )

    async def _wait_pods_gone(self) -> None:
        """Until the pods are gone the kubelet still holds their GPUs: releasing the gate's
        reservation earlier would let the next gate's pods wait for them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_wait_s
        ns, selector = self.workload.namespace, self.workload.selector
        while True:
            try:
                if not await asyncio.to_thread(self._api.list_pods, ns, selector):
                    return
            except TRANSIENT as exc:
                log.warning("waiting for %s pods to go: %s", self.role, api_reason(exc))
            if loop.time() >= deadline:
                log.warning("%s pods still terminating after %gs", self.role, self.stop_wait_s)
                return
            await asyncio.sleep(self.poll_s)

    def kill_now(self) -> None:
        """Synchronous last resort (a second Ctrl-C): delete everything, wait for nothing."""
        self._stopped = True
        if self._watcher is not None:
            self._watcher.cancel()
        for ref in list(reversed(self._created)):
            with contextlib.suppress(*TRANSIENT):
                self._api.delete(ref, timeout_s=5)
                self._created.remove(ref)
        if self._lease_held:
            self._lease_held = False
            self._gate_lease.kill_now()


if TYPE_CHECKING:

    def _is_an_engine(engine: KubernetesEngine) -> Engine:
        return engine
