"""The fake Kubernetes API server the launcher's tests share (tests/support/k8s_fake.py), with
the LeaderWorkerSet controller played on create."""

from __future__ import annotations

import pytest
from k8s_fake import LWS, FakeKubernetes, ObjectStore, lws_controller


@pytest.fixture
def fake() -> FakeKubernetes:
    store = ObjectStore()
    store.on_create.setdefault(LWS, []).append(lws_controller)
    return FakeKubernetes(store=store)
