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

Where: this module is the engine's lifecycle; what its pods say is read in `pod_status.py`
(pure), the API calls are `kube_api.py` and the gate's Lease is `gate_lease.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubernetes import client

from gate.core.errors import ClusterError as ClusterError  # it lived here: re-exported
from gate.core.errors import EngineError, ReadinessTimeout
from gate.engines.describe import engine_doc
from gate.engines.gate_lease import GateLease, cancel_task
from gate.engines.kube_api import TRANSIENT, KubeApi, ObjectRef, object_ref
from gate.engines.lifecycle import CrashInfo, PhaseLog
from gate.engines.manifests import (
    EngineManifests,
    EngineWorkload,
    dns_part,
    lease_name,
    render_engine,
)
from gate.engines.pod_status import (
    CrashEvidence,
    PodView,
    all_pulled,
    all_running,
    all_scheduled,
    find_crash,
    pod_view,
    pull_failure,
    start_failure,
    stuck_detail,
)
from gate.engines.readiness import wait_ready
from gate.reservations.kubernetes import api_reason
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
CRASH_LOG_LINES = 20
KEEP_LOG_LINES = 200


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
            ref = object_ref(manifest)
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
        await cancel_task(task)

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
