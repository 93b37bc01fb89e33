"""A fake Kubernetes API server behind the official client.

The real `kubernetes.client` (its ApiClient, REST layer, (de)serialisation and models) runs
unchanged; only urllib3's pool manager is replaced by this router, which answers with JSON that
the official client's own models serialise to (`ApiClient.sanitize_for_serialization`), i.e.
exactly the shapes a cluster returns. Requests are recorded so tests can assert what was sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
from kubernetes import client

Handler = Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any]]


def to_json(obj: Any) -> Any:
    """A model object as the API server would send it (camelCase keys, RFC 3339 times)."""
    return client.ApiClient().sanitize_for_serialization(obj)


@dataclass
class FakeKubernetes:
    routes: list[tuple[str, re.Pattern[str], Handler]] = field(default_factory=list)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)

    def route(self, method: str, path_regex: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(f"^{path_regex}$"), handler))

    def json(self, method: str, path_regex: str, body: Any, status: int = 200) -> None:
        self.route(method, path_regex, lambda *_: (status, body))

    # urllib3.PoolManager.request's signature, as the client's REST layer calls it.
    def request(self, method: str, url: str, **kw: Any) -> urllib3.HTTPResponse:
        parts = urlsplit(url)
        body = kw.get("body")
        parsed = json.loads(body) if isinstance(body, (str, bytes)) and body else body
        self.requests.append((method, parts.path, parsed))
        for m, rx, handler in self.routes:
            if m == method and rx.match(parts.path):
                status, payload = handler(method, parts.path, parse_qs(parts.query), parsed)
                return _response(status, payload)
        return _response(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"{parts.path} not found",
                "reason": "NotFound",
                "code": 404,
            },
        )

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = "https://fake-apiserver.invalid"
        api = client.ApiClient(cfg)
        api.rest_client.pool_manager = self  # type: ignore[assignment]
        return api


def _response(status: int, payload: Any) -> urllib3.HTTPResponse:
    data = json.dumps(payload).encode()
    return urllib3.HTTPResponse(
        body=data,
        status=status,
        headers={"Content-Type": "application/json"},
        preload_content=True,
        reason="OK" if status < 400 else "Error",
    )
