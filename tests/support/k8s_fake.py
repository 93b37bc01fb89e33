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

import io
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
from kubernetes import client

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
            key = (resource, meta["namespace"], meta["name"])
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

    def _missing(self, resource: str, name: str) -> tuple[int, Any]:
        plural = resource.rsplit("/", 1)[-1]
        return 404, status(404, "NotFound", f'{plural} "{name}" not found')

    def _post(self, resource: str, ns: str, body: Any) -> tuple[int, Any]:
        obj = json.loads(json.dumps(body))
        obj.setdefault("metadata", {})["namespace"] = ns
        name = obj["metadata"].get("name", "")
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
        self.calls.append(Call(method, parts.path, query, parsed))
        for m, rx, handler in self.routes:
            if m == method and rx.match(parts.path):
                status_code, payload = handler(method, parts.path, query, parsed)
                return _response(status_code, payload)
        if self.store is not None:
            answer = self.store.handle(method, parts.path, query, parsed)
            if answer is not None:
                return _response(*answer)
        return _response(404, status(404, "NotFound", f"{parts.path} not found"))

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = "https://fake-apiserver.invalid"
        api = client.ApiClient(cfg)
        api.rest_client.pool_manager = self  # type: ignore[assignment]
        return api


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
