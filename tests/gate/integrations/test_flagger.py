"""The Flagger hooks against Flagger's scheduler as its code runs (tests/support/flagger_driver.py,
each step cited there to fluxcd/flagger's source), the Canary, its target, its primary and their
pods read from the fake API server through the official client.

Each defect of issue 19 has a test that fails on the code before it: the checksum Flagger sends
names the previous revision (so a fixed revision got the old hold, and a rollback hook after a
continue started a second gate), and a held canary is never rolled back by the rollback hook."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import Recording
from fastapi.testclient import TestClient
from flagger_driver import CANARIES, Flagger
from k8s_fake import FakeKubernetes, ObjectStore, write_kubeconfig
from verdicts import CONTINUE_LINE, mixed_document

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.database import transaction
from gate.core.settings import Settings
from gate.integrations.flagger import RolloutImages, hook_answer, pinned
from gate.models import GateRun

ROOT = Path(__file__).resolve().parents[3]
REPO = "vllm/vllm-openai"
SHA = {
    tag: "sha256:" + (c * 64) for tag, c in (("v0.10.2", "a"), ("v0.11.0", "b"), ("v0.11.1", "c"))
}


# -- the pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "image_id", "want"),
    [
        # containerd: the repository digest as the registry names it
        (f"{REPO}:v0.11.0", f"docker.io/{REPO}@{SHA['v0.11.0']}", f"{REPO}@{SHA['v0.11.0']}"),
        # dockershim: docker-pullable:// in front
        (
            f"{REPO}:v0.11.0",
            f"docker-pullable://{REPO}@{SHA['v0.11.0']}",
            f"{REPO}@{SHA['v0.11.0']}",
        ),
        # a private registry with a port keeps the template's repository
        (
            "reg:5000/acme/vllm:v2",
            f"reg:5000/acme/vllm@{SHA['v0.11.1']}",
            f"reg:5000/acme/vllm@{SHA['v0.11.1']}",
        ),
        # a bare image id is the node's local image, not a registry digest: no pin
        (f"{REPO}:v0.11.0", SHA["v0.11.0"], None),
        (f"{REPO}:v0.11.0", "", None),
        (f"{REPO}:v0.11.0", f"{REPO}@sha256:short", None),
    ],
)
def test_pinned_takes_only_a_registry_digest(image: str, image_id: str, want: str | None) -> None:
    assert pinned(image, image_id) == want


def test_hook_answers_every_case() -> None:
    """The whole table: hook x (no gate, running, continue, hold) x (revert or not)."""
    for hook in ("confirm-rollout", "confirm-promotion", "rollback"):
        for verdict in (None, "continue", "hold"):
            for has_gate in (False, True):
                code, why = hook_answer(hook, verdict if has_gate else None, has_gate=has_gate)  # type: ignore[arg-type]
                if not has_gate:
                    assert code == 403 and why is not None and "no gate" in why
                elif hook == "rollback":
                    assert code == (200 if verdict == "hold" else 403)
                else:
                    assert code == (200 if verdict == "continue" else 403)
        ungated = hook_answer(hook, None, has_gate=False, progressing=True)  # type: ignore[arg-type]
        assert ungated[0] == (200 if hook == "rollback" else 403)
        reverted = hook_answer(hook, None, has_gate=False, same_image=True)  # type: ignore[arg-type]
        assert reverted[0] == (403 if hook == "rollback" else 200)


def test_same_image_is_a_revert() -> None:
    base = {"namespace": "n", "canary": "c", "target": "Deployment/c", "container": "engine"}
    assert RolloutImages(**base, candidate=f"{REPO}:v1", reference=f"{REPO}:v1").same_image
    assert not RolloutImages(**base, candidate=f"{REPO}:v2", reference=f"{REPO}:v1").same_image
    moved = RolloutImages(
        **base,
        candidate=f"{REPO}:latest",
        reference=f"{REPO}:v1",
        candidate_digest=f"{REPO}@{SHA['v0.10.2']}",
        reference_digest=f"{REPO}@{SHA['v0.10.2']}",
    )
    assert not moved.same_image  # only the templates' names count, never a digest from pods


# -- the scheduler against the real app ----------------------------------------------------------


class Env:
    def __init__(self, client: TestClient, fake: FakeKubernetes, recording: Recording, token: str):
        self.client, self.fake, self.recording, self.token = client, fake, recording, token
        self.answers: list[dict[str, Any]] = []

    def hook(self, kind: str, payload: dict[str, Any]) -> int:
        r = self.client.post(f"/v1/webhooks/flagger/{kind}", json=payload)
        assert r.status_code in (200, 403), r.text
        self.answers.append(r.json())
        return r.status_code

    def finish(self, gate_id: str, verdict: str) -> None:
        with transaction(self.client.app.state.ctx.factory) as s:  # type: ignore[attr-defined]
            row = s.get(GateRun, gate_id)
            assert row is not None
            row.state, row.verdict, row.reason = "complete", verdict, f"gate said {verdict}"

    def gate(self, gate_id: str) -> dict[str, Any]:
        r = self.client.get(
            f"/v1/gates/{gate_id}", headers={"Authorization": f"Bearer {self.token}"}
        )
        return r.json()  # type: ignore[no-any-return]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    fake = FakeKubernetes(store=ObjectStore())
    fake.intercept(monkeypatch)
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "examples" / "specs" / "kubernetes.yaml", specs / "vllm-h200-k8s.yaml")
    settings = Settings(
        data_dir=tmp_path / ".gate",
        spec_dir=specs,
        public_url="http://gate.test",
        flagger_cluster=str(write_kubeconfig(tmp_path / "kubeconfig")),
        flagger_namespaces=["serving"],
        flagger_annotate=True,
    )
    app = create_app(settings, start_workers=False)
    recording = Recording()
    app.state.ctx.dispatcher = recording
    token = create_token(app.state.ctx.factory, "flagger", ["run", "read"])
    with TestClient(app) as client:
        yield Env(client, fake, recording, token)


def webhooks(token: str, **extra: str) -> list[dict[str, Any]]:
    md = {"spec": "vllm-h200-k8s", "token": token, **extra}
    return [
        {"name": "gate", "type": "confirm-rollout", "metadata": md},
        {"name": "gate-promotion", "type": "confirm-promotion", "metadata": md},
        {"name": "gate-rollback", "type": "rollback", "metadata": md},
    ]


def flagger(env: Env, **md: str) -> Flagger:
    assert env.fake.store is not None
    f = Flagger(
        env.fake.store,
        env.hook,
        webhooks=webhooks(env.token, **md),
        digests={f"{REPO}:{t}": d for t, d in SHA.items()},
    )
    f.deploy(f"{REPO}:v0.10.2")
    f.initialise()
    return f


def test_new_revision_hold_fixed_revision_continue_promotion(env: Env) -> None:
    """The whole life of two revisions, as Flagger's scheduler drives it."""
    f = flagger(env)
    first_sum = f.checksum()
    f.deploy(f"{REPO}:v0.11.0")  # a new revision
    assert f.tick() == "Waiting"  # confirm-rollout: the gate is pending
    (bad,) = env.recording.submitted
    run = env.gate(bad)
    assert run["candidate"] == f"{REPO}:v0.11.0"  # the target's template: its pods are at zero
    assert run["reference"] == f"{REPO}@{SHA['v0.10.2']}"  # the primary's pods report a digest
    env.finish(bad, "hold")
    assert f.run(3) == ["Waiting"] * 3  # held: the canary waits
    assert [c[0] for c in f.calls] == ["confirm-rollout"] * 4  # never the rollback hook
    assert {c[2] for c in f.calls} == {first_sum}  # Flagger's checksum never moved

    f.deploy(f"{REPO}:v0.11.1")  # the user's fix; Flagger still sends the same checksum
    assert f.tick() == "Waiting"
    assert f.calls[-1][2] == first_sum
    assert len(env.recording.submitted) == 2, "the fixed revision must be a new gate"
    fixed = env.recording.submitted[1]
    assert env.answers[-1]["id"] == fixed and env.answers[-1]["verdict"] is None
    assert env.gate(fixed)["candidate"] == f"{REPO}:v0.11.1"
    env.finish(fixed, "continue")

    assert f.tick() == "Progressing"  # confirmed: LastAppliedSpec and the checksum move
    assert f.checksum() != first_sum
    phases = f.run(6)
    assert phases[-1] == "Succeeded", (phases, f.calls)
    kinds = [c[0] for c in f.calls]
    assert "rollback" in kinds and "confirm-promotion" in kinds
    assert all(code == 403 for kind, _, _, code in f.calls if kind == "rollback")
    assert [code for kind, _, _, code in f.calls if kind == "confirm-promotion"] == [200]
    assert len(env.recording.submitted) == 2, "no hook after confirm-rollout starts a gate"
    assert f.image("llama-primary") == f"{REPO}:v0.11.1"  # promoted


def test_rollback_hook_with_the_new_checksum_starts_no_gate(env: Env) -> None:
    """Before: the rollback call after a continue carried a new checksum, which made a new
    key, so it launched a second full gate on the GPUs (and could roll back a passed canary)."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (gid,) = env.recording.submitted
    env.finish(gid, "continue")
    assert f.tick() == "Progressing"
    f.tick()  # the rollback hook, with the checksum of the new LastAppliedSpec
    rollbacks = [c for c in f.calls if c[0] == "rollback"]
    assert rollbacks and rollbacks[0][2] != f.calls[0][2]
    assert rollbacks[0][3] == 403
    assert env.recording.submitted == [gid]
    assert env.answers[-1]["id"] == gid and env.answers[-1]["verdict"] == "continue"


def test_a_held_canary_is_never_rolled_back_and_shows_in_kubectl(env: Env) -> None:
    """Flagger does not call the rollback hook while confirm-rollout refuses: the canary sits in
    Waiting. The gate puts its verdict on the Canary (annotations, a Warning Event) so a person
    sees why in `kubectl describe canary`; reverting the target to the primary's image ends it."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (gid,) = env.recording.submitted
    env.finish(gid, "hold")
    assert f.run(4) == ["Waiting"] * 4
    assert all(c[0] == "confirm-rollout" for c in f.calls)
    annotations = f.canary["metadata"]["annotations"]
    assert annotations["llm-deploy-gate.io/verdict"] == "hold"
    assert annotations["llm-deploy-gate.io/reason"] == "gate said hold"
    assert annotations["llm-deploy-gate.io/report"] == f"http://gate.test/gates/{gid}"
    assert annotations["llm-deploy-gate.io/candidate"] == f"{REPO}:v0.11.0"
    assert env.fake.store is not None
    events = env.fake.store.items("events", "serving")
    assert len(events) == 1, "polling writes the hold once"
    (event,) = events
    assert event["type"] == "Warning" and event["reason"] == "DeployGateHold"
    assert event["involvedObject"]["kind"] == "Canary" and "gate said hold" in event["message"]
    patches = env.fake.sent(
        "PATCH", f"/apis/{CANARIES.replace('/', '/v1beta1/namespaces/serving/')}/llama"
    )
    assert len(patches) == 1

    f.deploy(f"{REPO}:v0.10.2")  # the documented way out: the primary's image back on the target
    assert f.tick() == "Progressing"
    assert env.answers[-1]["reason"].startswith("the target holds the primary's image again")
    assert f.run(6)[-1] == "Succeeded"
    assert env.recording.submitted == [gid]


def test_revision_changed_during_analysis_is_rolled_back_not_served_ungated(env: Env) -> None:
    """Flagger restarts the analysis of a revision that changes while Progressing without asking
    confirm-rollout again (scheduler.go:327-350), and that revision takes canary traffic: the
    rollback hook finds no gate for it and rolls it back; it is never promoted."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (gid,) = env.recording.submitted
    env.finish(gid, "continue")
    assert f.tick() == "Progressing"
    f.deploy(f"{REPO}:v0.11.1")  # changed mid-analysis
    phases = f.run(3)
    assert phases[-1] == "Failed", phases
    rollbacks = [
        a for (kind, *_), a in zip(f.calls, env.answers, strict=True) if kind == "rollback"
    ]
    assert "never gated" in rollbacks[-1]["reason"]
    assert not [c for c in f.calls if c[0] == "confirm-promotion"]
    assert env.recording.submitted == [gid]
    assert f.image("llama-primary") == f"{REPO}:v0.10.2"


def test_pods_of_another_template_give_no_digest(env: Env) -> None:
    """A pod still running (or terminating) with the primary's image under the target's labels
    must neither pin the candidate to the primary's bytes nor make it look like a revert."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    assert env.fake.store is not None
    env.fake.store.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "llama-old", "namespace": "serving", "labels": {"app": "llama"}},
            "spec": {"containers": [{"name": "engine", "image": f"{REPO}:v0.10.2"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "engine",
                        "image": f"{REPO}:v0.10.2",
                        "imageID": f"docker.io/{REPO}@{SHA['v0.10.2']}",
                        "ready": True,
                        "restartCount": 0,
                    }
                ],
            },
        },
    )
    assert f.tick() == "Waiting"
    (gid,) = env.recording.submitted  # gated, not waved through as "nothing new"
    assert env.gate(gid)["candidate"] == f"{REPO}:v0.11.0"


def test_a_spec_edit_mid_analysis_keeps_the_revisions_gate(env: Env, tmp_path: Path) -> None:
    """With a cluster the key names the spec by name, not by content: the operator editing
    the spec file while the canary progresses does not strand confirm-promotion."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (gid,) = env.recording.submitted
    env.finish(gid, "continue")
    assert f.tick() == "Progressing"
    spec = tmp_path / "specs" / "vllm-h200-k8s.yaml"
    spec.write_text(spec.read_text().replace('"8192"]', '"16384"]'))
    assert f.run(6)[-1] == "Succeeded"
    assert env.recording.submitted == [gid]


def test_a_metadata_override_is_keyed_by_the_cluster_revision_too(env: Env) -> None:
    """A Canary that still carries a `candidate_image` gets a new gate for each revision the
    target holds, not the first revision's verdict forever."""
    f = flagger(env, candidate_image=f"{REPO}:v0.11.0")
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (first,) = env.recording.submitted
    env.finish(first, "continue")
    f.status["phase"] = "Succeeded"  # that revision went through; the next one arrives
    f.deploy(f"{REPO}:v0.11.1")
    f.tick()
    assert len(env.recording.submitted) == 2


def test_an_unreachable_cluster_is_502_not_500(tmp_path: Path) -> None:
    from gate.core.errors import ClusterError
    from gate.integrations.flagger import read_rollout
    from gate.reservations.kubernetes import connect

    cfg = write_kubeconfig(tmp_path / "kc", server="http://127.0.0.1:9")  # nothing listens
    api_client = connect(kubeconfig=str(cfg))[0]
    with pytest.raises(ClusterError, match="reading Canary serving/llama"):
        read_rollout(api_client, "serving", "llama", None)


def test_a_cluster_that_never_answers_is_given_up_inside_flaggers_timeout(tmp_path: Path) -> None:
    """A server that takes the connection and says nothing (a wedged API server). The official
    client's urllib3 retries a timed-out GET three times (kubernetes/client/rest.py: pool_args
    'retries' only when Configuration.retries is set; urllib3 defaults to Retry(3)), so one
    5 s read took 20 s; the hook's client has none, and its calls end by one deadline
    (GATE_FLAGGER_BUDGET_S, 8 s), so the read is one ClusterError (502) inside Flagger's 10 s."""
    import socket

    from gate.core.errors import ClusterError
    from gate.integrations.flagger import HOOK_BUDGET_S, read_rollout
    from gate.reservations.kubernetes import connect

    assert HOOK_BUDGET_S < 10  # docs/integrations/flagger.md: Flagger's default hook timeout
    assert Settings().flagger_budget_s == HOOK_BUDGET_S
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # connections complete in the backlog; nothing is ever read or sent
        cfg = write_kubeconfig(tmp_path / "kc", server=f"http://127.0.0.1:{mute.getsockname()[1]}")
        api_client = connect(kubeconfig=str(cfg), retries=0)[0]
        started = time.monotonic()
        with pytest.raises(ClusterError, match="reading Canary serving/llama"):
            read_rollout(api_client, "serving", "llama", None, deadline=started + 2.0)
        waited = time.monotonic() - started
        api_client.close()
    # one read, waited out until the deadline: not less, and not a retry's second wait
    assert 1.5 <= waited < 4.0, waited


def test_the_hooks_calls_share_one_deadline() -> None:
    """Each call's timeout is what is left before the hook's deadline (the connect at most
    CONNECT_S); past it no call is made: a ClusterError that says the cluster took the time."""
    from gate.core.errors import ClusterError
    from gate.integrations.flagger import CONNECT_S, timeout_until

    connect_s, read_s = timeout_until(time.monotonic() + 60, "x")
    assert connect_s == CONNECT_S and 59 < read_s <= 60
    connect_s, read_s = timeout_until(time.monotonic() + 1.0, "x")
    assert connect_s <= 1.0 and read_s <= 1.0
    with pytest.raises(ClusterError, match="reading Canary a/b: the cluster took all"):
        timeout_until(time.monotonic() - 1, "reading Canary a/b")


def test_the_same_revision_asked_again_is_the_same_gate_and_key_reruns(env: Env) -> None:
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.run(3)
    assert len(env.recording.submitted) == 1
    again = flagger_key_rerun(env)
    assert again != env.recording.submitted[0] and len(env.recording.submitted) == 2


def flagger_key_rerun(env: Env) -> str:
    """`metadata.key` changed on purpose: a new gate for the same revision, itself idempotent."""
    md = {"spec": "vllm-h200-k8s", "token": env.token, "key": "attempt-2"}
    body = {
        "name": "llama",
        "namespace": "serving",
        "phase": "Waiting",
        "checksum": "x",
        "metadata": md,
    }
    ids = {
        env.client.post("/v1/webhooks/flagger/confirm-rollout", json=body).json()["id"]
        for _ in range(2)
    }
    (gid,) = ids
    return str(gid)


def test_cluster_refusals_name_the_field(env: Env) -> None:
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    md = {"spec": "vllm-h200-k8s", "token": env.token}

    def post(**over: Any) -> Any:
        body = {"name": "llama", "namespace": "serving", "checksum": "x", "metadata": dict(md)}
        body.update(over)
        return env.client.post("/v1/webhooks/flagger/confirm-rollout", json=body)

    r = post(namespace="kube-system")
    assert r.status_code == 422 and r.json()["error"]["problems"][0]["path"] == "namespace"
    r = post(name="missing")
    assert r.status_code == 502 and "Canary serving/missing not found" in r.text
    r = post(metadata={**md, "eventMessage": "x"})
    assert r.status_code == 422
    assert r.json()["error"]["problems"][0]["path"] == "metadata.eventMessage"
    r = post(metadata={**md, "container": "sidecar"})
    assert r.status_code == 422
    assert r.json()["error"]["problems"][0]["path"] == "metadata.container"
    # an image the cluster holds must still be one the operator allows
    f.deploy("evil.example/miner:v1")
    r = post()
    assert r.status_code == 422
    assert r.json()["error"]["problems"][0]["path"] == "candidate_image"
    assert env.recording.submitted == []


def test_a_continue_with_warnings_is_a_200_that_says_them(env: Env) -> None:
    """The status code stays binary; the body and the Canary's annotations carry the summary
    line, the warnings and what the gate could not show (issue 28 item 6)."""
    f = flagger(env)
    f.deploy(f"{REPO}:v0.11.0")
    f.tick()
    (gid,) = env.recording.submitted
    document = mixed_document(hold=False, gate_id=gid).to_json()
    with transaction(env.client.app.state.ctx.factory) as s:  # type: ignore[attr-defined]
        row = s.get(GateRun, gid)
        assert row is not None
        row.state, row.verdict, row.reason, row.document = "complete", "continue", None, document
    assert f.tick() == "Progressing"
    assert f.calls[-1][0] == "confirm-rollout" and f.calls[-1][3] == 200
    answer = env.answers[-1]
    assert answer["verdict"] == "continue" and answer["summary"] == CONTINUE_LINE
    assert [w["check"] for w in answer["warnings"]] == ["steady.itl.p50", "steady.errors"]
    assert [n["check"] for n in answer["not_shown"]] == ["steady.ttft.p90"]
    annotations = f.canary["metadata"]["annotations"]
    assert annotations["llm-deploy-gate.io/verdict"] == "continue"
    assert annotations["llm-deploy-gate.io/summary"] == CONTINUE_LINE
    assert env.fake.store is not None
    assert env.fake.store.items("events", "serving") == [], "a continue is no Warning Event"
    assert f.run(6)[-1] == "Succeeded"  # warnings never stop the rollout
