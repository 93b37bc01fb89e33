"""A fake Kubernetes API server behind the official client.

The real `kubernetes.client` (its ApiClient, REST layer, (de)serialisation and models) runs
unchanged; only urllib3's pool manager is replaced by this router, which answers with JSON that
the official client's own models serialise to (`ApiClient.sanitize_for_serialization`), i.e.
exactly the shapes a cluster returns. Requests are recorded so tests can assert what was sent.

Routes registered with `route`/`json` answer first. A `FakeKubernetes(store=ObjectStore())`
then serves namespaced objects statefully, like an API server backed by etcd: POST creates
(uid, resourceVersion, creationTimestamp filled in; 409 when the name is taken), GET reads one
or lists with an equality label selector, PATCH merges, DELETE removes and cascades along
ownerReferences as the garbage collector would (unless propagationPolicy is Orphan), and
`pods/{name}/log` answers text with `tailLines` and `previous` honoured. Hooks let a test play
the controllers and the kubelet: `on_create[plural]` runs after an object is created,
`on_list[plural]` before a list is served (e.g. to advance pod status one step per poll).
"""

from __future__ import annotations

import contextlib
import http.server
import io
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import rest

Handler = Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any]]
Key = tuple[str, str, str]  # (resource: "pods" or "group/plural", namespace, name)


def to_json(obj: Any) -> Any:
    """A model object as the API server would send it (camelCase keys, RFC 3339 times)."""
    return client.ApiClient().sanitize_for_serialization(obj)


@dataclass(frozen=True)
class Text:
    """A text/plain answer (pod logs), not JSON."""

    body: str


@dataclass(frozen=True)
class Call:
    """One request as sent: method, path, parsed query and JSON body."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


_CLUSTER = re.compile(r"^/api/v1/(nodes|pods)(?:/([^/]+))?$")  # nodes; pods of all namespaces
_CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(log|status))?$")
_GROUP = re.compile(
    r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(status))?$"
)
RETURN_STATUS_ON_DELETE = {"coordination.k8s.io/leases"}
LIST_KINDS = {"pods": "PodList", "services": "ServiceList", "leases": "LeaseList"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v.lstrip("="):
                return False
        elif labels.get(term) is None:
            return False
    return True


@dataclass
class ObjectStore:
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, pod) -> current log
    previous_logs: dict[tuple[str, str], str] = field(default_factory=dict)
    on_create: dict[str, list[Callable[[ObjectStore, dict[str, Any]], None]]] = field(
        default_factory=dict
    )
    on_list: dict[str, list[Callable[[ObjectStore], None]]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- direct access for tests ---------------------------------------------------------------

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object as the API server would (also for objects a controller makes)."""
        with self.lock:
            meta = obj.setdefault("metadata", {})
            key = (resource, meta.get("namespace", ""), meta["name"])  # "": cluster-scoped
            if key in self.objects:
                raise KeyError(key)
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(next(self._rv))
            meta["creationTimestamp"] = _now()
            if resource == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            self.objects[key] = obj
        for hook in self.on_create.get(resource, []):
            hook(self, obj)
        return obj

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                o
                for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and (namespace is None or ns == namespace)
            ]

    def set_status(self, resource: str, namespace: str, name: str, new: dict[str, Any]) -> None:
        """Replace an object's status (what the kubelet or a controller writes)."""
        with self.lock:
            obj = self.objects[(resource, namespace, name)]
            obj["status"] = new
            obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def remove(
        self, resource: str, namespace: str, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete, then collect dependents along ownerReferences (the garbage collector)."""
        with self.lock:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is None:
                return False
            if propagation == "Orphan":
                return True
            gone = {obj["metadata"]["uid"]}
            while True:
                owned = [
                    key
                    for key, o in self.objects.items()
                    if any(
                        ref.get("uid") in gone for ref in o["metadata"].get("ownerReferences") or []
                    )
                ]
                if not owned:
                    return True
                for key in owned:
                    gone.add(self.objects.pop(key)["metadata"]["uid"])

    # -- HTTP ------------------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any] | None:
        c = _CLUSTER.match(path)
        if c and method == "GET":
            return self._cluster_get(c.group(1), c.group(2), query)
        m = _CORE.match(path)
        if m:
            ns, plural, name, sub = m.groups()
            resource, api_version = plural, "v1"
        else:
            g = _GROUP.match(path)
            if not g:
                return None
            group, version, ns, plural, name, sub = g.groups()
            resource, api_version = f"{group}/{plural}", f"{group}/{version}"
        if sub == "log":
            return self._log(ns, name, query)
        if name is None:
            if method == "POST":
                return self._post(resource, ns, body)
            if method == "GET":
                return self._list(resource, plural, api_version, ns, query)
            return None
        if method == "GET":
            obj = self.get(resource, ns, name)
            return (200, obj) if obj is not None else self._missing(resource, name)
        if method == "PATCH":
            with self.lock:
                obj = self.get(resource, ns, name)
                if obj is None:
                    return self._missing(resource, name)
                _merge(obj, body or {})
                obj["metadata"]["resourceVersion"] = str(next(self._rv))
                return 200, obj
        if method == "PUT":
            with self.lock:
                if self.get(resource, ns, name) is None:
                    return self._missing(resource, name)
                self.objects[(resource, ns, name)] = body
                return 200, body
        if method == "DELETE":
            policy = (body or {}).get("propagationPolicy") or query.get(
                "propagationPolicy", ["Background"]
            )[0]
            with self.lock:
                obj = self.get(resource, ns, name)
                if obj is None or not self.remove(resource, ns, name, policy):
                    return self._missing(resource, name)
            if resource in RETURN_STATUS_ON_DELETE:
                return 200, status(200, "", f"{name} deleted")
            # Like the API server: pods, services and custom objects answer with the object.
            gone = json.loads(json.dumps(obj))
            gone["metadata"]["deletionTimestamp"] = _now()
            return 200, gone
        return None

    def _cluster_get(
        self, plural: str, name: str | None, query: dict[str, list[str]]
    ) -> tuple[int, Any]:
        """Nodes (cluster-scoped, stored with namespace "") or pods of every namespace."""
        if name is not None:
            obj = self.get(plural, "", name) if plural == "nodes" else None
            return (200, obj) if obj is not None else self._missing(plural, name)
        for hook in self.on_list.get(plural, []):
            hook(self)
        selector = query.get("labelSelector", [""])[0]
        not_phases = {
            t.split("!=", 1)[1]
            for t in query.get("fieldSelector", [""])[0].split(",")
            if t.startswith("status.phase!=")
        }
        with self.lock:
            items = [
                json.loads(json.dumps(o))
                for o in self.items(plural)
                if _matches(o["metadata"].get("labels") or {}, selector)
                and (o.get("status") or {}).get("phase") not in not_phases
            ]
            rv = str(next(self._rv))
        kind = "NodeList" if plural == "nodes" else "PodList"
        return 200, {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    def _missing(self, resource: str, name: str) -> tuple[int, Any]:
        plural = resource.rsplit("/", 1)[-1]
        return 404, status(404, "NotFound", f'{plural} "{name}" not found')

    def _post(self, resource: str, ns: str, body: Any) -> tuple[int, Any]:
        obj = json.loads(json.dumps(body))
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):  # as the API server does
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name", "")
        try:
            created = self.create(resource, obj)
        except KeyError:
            plural = resource.rsplit("/", 1)[-1]
            return 409, status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        return 201, created

    def _list(
        self, resource: str, plural: str, api_version: str, ns: str, query: dict[str, list[str]]
    ) -> tuple[int, Any]:
        for hook in self.on_list.get(resource, []):
            hook(self)
        selector = query.get("labelSelector", [""])[0]
        with self.lock:
            items = [
                json.loads(json.dumps(o))
                for o in self.items(resource, ns)
                if _matches(o["metadata"].get("labels") or {}, selector)
            ]
            rv = str(next(self._rv))
        kind = LIST_KINDS.get(plural, f"{plural.capitalize()}List")
        return 200, {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    def _log(self, ns: str, name: str | None, query: dict[str, list[str]]) -> tuple[int, Any]:
        if name is None or self.get("pods", ns, name) is None:
            return self._missing("pods", name or "")
        previous = query.get("previous", ["false"])[0] == "true"
        text = (self.previous_logs if previous else self.logs).get((ns, name))
        if text is None:
            if previous:
                msg = f'previous terminated container "engine" in pod "{name}" not found'
                return 400, status(400, "BadRequest", msg)
            text = ""
        lines = text.splitlines()
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"][0]) :]
        return 200, Text("\n".join(lines) + ("\n" if lines else ""))


@dataclass
class FakeKubernetes:
    routes: list[tuple[str, re.Pattern[str], Handler]] = field(default_factory=list)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    store: ObjectStore | None = None
    calls: list[Call] = field(default_factory=list)

    def route(self, method: str, path_regex: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(f"^{path_regex}$"), handler))

    def json(self, method: str, path_regex: str, body: Any, status: int = 200) -> None:
        self.route(method, path_regex, lambda *_: (status, body))

    def sent(self, method: str, path_regex: str = ".*") -> list[Call]:
        """The recorded calls of one method whose path matches."""
        rx = re.compile(f"^{path_regex}$")
        return [c for c in self.calls if c.method == method and rx.match(c.path)]

    # urllib3.PoolManager.request's signature, as the client's REST layer calls it.
    def request(self, method: str, url: str, **kw: Any) -> urllib3.HTTPResponse:
        parts = urlsplit(url)
        body = kw.get("body")
        parsed = json.loads(body) if isinstance(body, (str, bytes)) and body else body
        query = parse_qs(parts.query)
        self.requests.append((method, parts.path, parsed))
        self.calls.append(Call(method, parts.path, query, parsed, dict(kw.get("headers") or {})))
        for m, rx, handler in self.routes:
            if m == method and rx.match(parts.path):
                status_code, payload = handler(method, parts.path, query, parsed)
                return _response(status_code, payload)
        if self.store is not None:
            answer = self.store.handle(method, parts.path, query, parsed)
            if answer is not None:
                return _response(*answer)
        return _response(404, status(404, "NotFound", f"{parts.path} not found"))

    def clear(self) -> None:
        """urllib3.PoolManager.clear, which ApiClient.close calls: nothing to close here."""

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = "https://fake-apiserver.invalid"
        api = client.ApiClient(cfg)
        api.rest_client.pool_manager = self  # type: ignore[assignment]
        return api

    def intercept(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every client the code under test builds itself (from a kubeconfig, in-cluster)
        sends its requests here instead of to the network, for the rest of the test."""
        original = rest.RESTClientObject.__init__
        fake = self

        def init(obj: rest.RESTClientObject, *args: Any, **kw: Any) -> None:
            original(obj, *args, **kw)
            obj.pool_manager = fake  # type: ignore[assignment]

        monkeypatch.setattr(rest.RESTClientObject, "__init__", init)


@contextlib.contextmanager
def serve_http(fake: FakeKubernetes) -> Iterator[str]:
    """The fake as a real HTTP API server on a loopback port, for code in another process (a
    real `gate serve`): the official client there sends real requests, answered by the same
    routes and store. Yields the server's URL for a kubeconfig (`write_kubeconfig(server=)`)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            got = fake.request(self.command, self.path, body=body, headers=dict(self.headers))
            data = got.data or b""
            self.send_response(got.status)
            self.send_header("Content-Type", got.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(
    path: Path,
    *,
    cluster: str = "h200-prod",
    token: str = "gate-token",
    namespace: str = "default",
    server: str = "https://fake-apiserver.invalid",
) -> Path:
    """A kubeconfig with one context, `gate@<cluster>`, whose server is the fake's address
    (intercepted in this process) or `server` (the fake served over HTTP, `serve_http`)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "insecure-skip-tls-verify": True,
                },
            }
        ],
        "users": [{"name": "gate", "user": {"token": token}}],
        "contexts": [
            {
                "name": f"gate@{cluster}",
                "context": {"cluster": cluster, "user": "gate", "namespace": namespace},
            }
        ],
        "current-context": f"gate@{cluster}",
    }
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def _response(status: int, payload: Any) -> urllib3.HTTPResponse:
    if isinstance(payload, Text):
        data, ctype = payload.body.encode(), "text/plain"
    else:
        data, ctype = json.dumps(payload).encode(), "application/json"
    # A stream, as from a socket: urllib3 reports an empty preloaded bytes body as None.
    return urllib3.HTTPResponse(
        body=io.BytesIO(data),
        status=status,
        headers={"Content-Type": ctype},
        preload_content=True,
        reason="OK" if status < 400 else "Error",
    )


# -- the controllers a cluster runs: LeaderWorkerSet and the kubelet ---------------------------

LWS = "leaderworkerset.x-k8s.io/leaderworkersets"


def pinned_nodes(pod: dict[str, Any]) -> list[str]:
    """The nodes a rendered pod's required node affinity allows."""
    aff = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(aff["nodeSelectorTerms"][0]["matchExpressions"][0]["values"])


def lws_controller(store: ObjectStore, lws: dict[str, Any]) -> None:
    """What the LWS controller (and its StatefulSets) make of one group: the leader
    `<name>-0` and workers `<name>-0-<i>`, owned by the LWS."""
    meta, lwt = lws["metadata"], lws["spec"]["leaderWorkerTemplate"]
    owner = {
        "apiVersion": lws["apiVersion"],
        "kind": "LeaderWorkerSet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    names = [f"{meta['name']}-0"] + [f"{meta['name']}-0-{i}" for i in range(1, lwt["size"])]
    for i, name in enumerate(names):
        template = lwt["leaderTemplate" if i == 0 else "workerTemplate"]
        labels = {
            **template["metadata"]["labels"],
            "leaderworkerset.sigs.k8s.io/name": meta["name"],
        }
        store.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "spec": json.loads(json.dumps(template["spec"])),
            },
        )


def container_status(
    image: str,
    *,
    waiting: str | None = None,
    message: str | None = None,
    running: bool = False,
    restarts: int = 0,
    last: tuple[str, int] | None = None,
) -> client.V1ContainerStatus:
    state = client.V1ContainerState(
        waiting=client.V1ContainerStateWaiting(reason=waiting, message=message)
        if waiting
        else None,
        running=client.V1ContainerStateRunning(started_at=datetime.now(UTC)) if running else None,
    )
    last_state = None
    if last is not None:
        last_state = client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(reason=last[0], exit_code=last[1])
        )
    pulling = waiting in ("ContainerCreating", "ErrImagePull", "ImagePullBackOff")
    return client.V1ContainerStatus(
        name="engine",
        image=image,
        image_id="" if pulling else f"{image}@sha256:ab",
        ready=running,
        restart_count=restarts,
        started=running,
        state=state,
        last_state=last_state,
    )


def scheduled(ok: bool, message: str = "") -> client.V1PodCondition:
    if ok:
        return client.V1PodCondition(type="PodScheduled", status="True")
    return client.V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message=message
    )


def _pending(image: str, waiting: str, message: str | None = None) -> client.V1PodStatus:
    return client.V1PodStatus(
        phase="Pending",
        conditions=[scheduled(True)],
        container_statuses=[container_status(image, waiting=waiting, message=message)],
    )


def _running(image: str, **kw: Any) -> client.V1PodStatus:
    return client.V1PodStatus(
        phase="Running",
        conditions=[scheduled(True)],
        container_statuses=[container_status(image, **kw)],
    )


UNSCHEDULABLE = (
    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are "
    "available: 4 No preemption victims found for incoming pod."
)
# Each stage: the pod status the kubelet reports (built from the client's own models, for the
# pod's image), and whether the pod is bound to its node.
STAGES: dict[str, tuple[Callable[[str], client.V1PodStatus], bool]] = {
    "pending": (lambda image: client.V1PodStatus(phase="Pending"), False),
    "unschedulable": (
        lambda image: client.V1PodStatus(
            phase="Pending", conditions=[scheduled(False, UNSCHEDULABLE)]
        ),
        False,
    ),
    "creating": (lambda image: _pending(image, "ContainerCreating"), True),
    "pull_failed": (
        lambda image: _pending(
            image, "ErrImagePull", f'failed to pull and unpack image "{image}": not found'
        ),
        True,
    ),
    "pull_backoff": (
        lambda image: _pending(image, "ImagePullBackOff", f'Back-off pulling image "{image}"'),
        True,
    ),
    "config_error": (
        lambda image: _pending(image, "CreateContainerConfigError", 'secret "hf" not found'),
        True,
    ),
    "crashloop": (
        lambda image: _running(image, waiting="CrashLoopBackOff", restarts=1, last=("Error", 1)),
        True,
    ),
    "running": (lambda image: _running(image, running=True), True),
    "oom_restarted": (
        lambda image: _running(image, running=True, restarts=1, last=("OOMKilled", 137)),
        True,
    ),
}


class Kubelet:
    """Moves every pod one stage further each time pods are listed (launchers poll by
    listing), so phases follow one another deterministically however slow the machine is.
    `by_role` gives the pods of one engine (label gate.dev/role) stages of their own."""

    def __init__(
        self,
        store: ObjectStore,
        stages: Sequence[str],
        by_role: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.store, self.stages = store, list(stages)
        self.by_role = {role: list(s) for role, s in (by_role or {}).items()}
        self.step: dict[str, int] = {}
        store.on_list.setdefault("pods", []).append(self.advance)

    def advance(self, store: ObjectStore) -> None:
        with store.lock:
            for pod in store.items("pods"):
                meta = pod["metadata"]
                labels = meta.get("labels") or {}
                if labels.get("app.kubernetes.io/managed-by") != "llm-deploy-gate":
                    continue  # another workload's pod: its status is its own
                stages = self.by_role.get(labels.get("gate.dev/role", ""))
                stages = self.stages if stages is None else stages
                i = self.step.get(meta["name"], -1) + 1
                if i >= len(stages):
                    continue
                self.step[meta["name"]] = i
                self.put(pod, stages[i])

    def put(self, pod: dict[str, Any], stage: str) -> None:
        make, bound = STAGES[stage]
        meta = pod["metadata"]
        with self.store.lock:
            if bound:
                # Workers `<name>-0-<i>` are pinned to nodes[1:], the leader to nodes[0].
                nodes = pinned_nodes(pod)
                index = int(meta["name"].rsplit("-", 1)[-1]) if "-0-" in meta["name"] else 1
                pod["spec"]["nodeName"] = nodes[(index - 1) % len(nodes)]
            image = pod["spec"]["containers"][0]["image"]
            self.store.set_status("pods", meta["namespace"], meta["name"], to_json(make(image)))


def store_of(fake: FakeKubernetes) -> ObjectStore:
    """The fake's object store (tests build the fake with one)."""
    assert fake.store is not None
    return fake.store
