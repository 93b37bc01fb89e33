"""The integration docs work as written, against a real `gate serve`: the Argo Rollouts
AnalysisTemplate is sent the way Argo's web provider sends it and measured and assessed as
Argo's code does (tests/support/argo_driver.py); the Flagger Canary's hooks are called as
Flagger's scheduler calls them (tests/support/flagger_driver.py) while the gate reads the
Canary from a Kubernetes API server over HTTP; the GitHub Actions and GitLab CI scripts run in
bash."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from argo_driver import MetricRun
from flagger_driver import Flagger
from k8s_fake import FakeKubernetes, ObjectStore, serve_http, write_kubeconfig

from gate.core.database import open_migrated, transaction
from gate.core.settings import Settings
from gate.models import GateRun

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "integrations"


def yaml_blocks(path: Path) -> list[Any]:
    text = path.read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def named_specs(tmp_path: Path) -> Path:
    d = tmp_path / "specs"
    d.mkdir()
    shutil.copy(ROOT / "examples" / "specs" / "kubernetes.yaml", d / "vllm-h200-k8s.yaml")
    return d


# -- a real `gate serve` ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BROKER_DOWN = "redis://127.0.0.1:9/0"  # nothing listens on port 9: gates stay pending


class GateServer:
    """`gate serve` as a process that a test can stop (an outage) and start again on the same
    port and data; the gates' rows are reachable for the test to decide them."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "GATE_DATA_DIR": str(tmp_path / ".gate"),
            "GATE_SPEC_DIR": str(named_specs(tmp_path)),
            "GATE_PUBLIC_URL": self.base,
            "HOME": str(tmp_path),  # no ~/.kube/config
            **env,
        }
        self.settings = Settings(data_dir=tmp_path / ".gate")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(150):
            try:
                httpx.get(f"{self.base}/metrics", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("gate serve did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None

    def token(self, name: str, scopes: str) -> str:
        """`gate token create NAME --scopes S`, as the docs tell the operator."""
        done = subprocess.run(
            [sys.executable, "-m", "gate", "token", "create", name, "--scopes", scopes],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        (token,) = re.findall(r"gt_[A-Za-z0-9_-]+", done.stdout)
        return token

    def finish(self, gate_id: str, verdict: str, state: str = "complete") -> None:
        factory = open_migrated(self.settings.resolved_database_url())
        with transaction(factory) as s:
            row = s.get(GateRun, gate_id)
            assert row is not None
            row.state, row.verdict, row.reason = state, verdict, f"gate said {verdict}"
        factory.kw["bind"].dispose()


@contextlib.contextmanager
def serving(tmp_path: Path, **env: str) -> Iterator[GateServer]:
    server = GateServer(tmp_path, env)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- Argo Rollouts ---------------------------------------------------------------------------


def substitute(value: Any, args: dict[str, str]) -> Any:
    if isinstance(value, str):
        return re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: args[m.group(1)], value)
    if isinstance(value, dict):
        return {k: substitute(v, args) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, args) for v in value]
    return value


def condition(expr: str, result: dict[str, Any]) -> bool:
    """The conditions the template uses: `result.<field> == "<value>"` (Argo's expr language;
    a null field compares unequal)."""
    m = re.fullmatch(r'result\.(\w+) == "([^"]*)"', expr.strip())
    assert m, f"the doc uses a condition this test does not model: {expr}"
    return bool(result.get(m.group(1)) == m.group(2))


def argo_template() -> dict[str, Any]:
    return next(  # type: ignore[no-any-return]
        b for b in yaml_blocks(DOCS / "argo-rollouts.md") if b["kind"] == "AnalysisTemplate"
    )


class ArgoWeb:
    """Argo's `web` provider sending the template's request (webmetric.go): non-2xx or no
    answer is an Error measurement, else the conditions decide (failure first)."""

    def __init__(self, metric: dict[str, Any], base: str, args: dict[str, str]) -> None:
        web = metric["provider"]["web"]
        assert web["jsonPath"] == "{$}"
        self.metric, self.web = metric, web
        self.url = base + httpx.URL(substitute(web["url"], args)).path
        self.headers = {h["key"]: substitute(h["value"], args) for h in web["headers"]}
        self.body = substitute(web["jsonBody"], args)
        self.results: list[dict[str, Any]] = []

    def measure(self) -> str:
        try:
            r = httpx.request(
                self.web["method"],
                self.url,
                headers=self.headers,
                json=self.body,
                timeout=self.web["timeoutSeconds"],
            )
        except httpx.HTTPError:
            return "Error"
        if not 200 <= r.status_code < 300:
            return "Error"
        result = r.json()
        self.results.append(result)
        if condition(self.metric["failureCondition"], result):
            return "Failed"
        if condition(self.metric["successCondition"], result):
            return "Successful"
        return "Inconclusive"


def test_argo_analysis_template_as_written(tmp_path: Path) -> None:
    """The template against a real `gate serve`, measured and assessed as Argo's code does:
    polling starts one gate, an outage of the service is retried every 10 s and survived, and
    the verdict ends the metric."""
    metric = argo_template()["spec"]["metrics"][0]
    assert "count" not in metric  # see the doc: a count would let an undecided gate pass
    with serving(tmp_path, GATE_BROKER_URL=BROKER_DOWN) as server:
        token = server.token("argo-rollouts", "run")
        args = {"candidate-image": "vllm/vllm-openai:v0.11.1", "gate-token": token}
        web = ArgoWeb(metric, server.base, args)
        steps: list[str] = []

        def measure(now: float) -> tuple[str, float]:
            i = len(steps)
            if i == 3:
                server.stop()  # the gate service goes away for five measurements
            if i == 8:
                server.start()
            if i == 10:
                server.finish(web.results[0]["id"], "continue")
            steps.append(web.measure())
            return steps[-1], 0.05

        run = MetricRun(metric)
        assert run.run(measure) == "Successful"
        assert steps == ["Inconclusive"] * 3 + ["Error"] * 5 + ["Inconclusive"] * 2 + ["Successful"]
        ids = {r["id"] for r in web.results}
        assert len(ids) == 1  # polling (and the outage) started one gate
        gid = ids.pop()
        times = [t for t, _ in run.timeline]
        gaps = [round(b - a) for a, b in itertools.pairwise(times)]
        assert gaps[3:8] == [10] * 5  # after an Error: 10 s, not the 30 s interval
        assert gaps[:2] == [30, 30]
        view = httpx.get(
            f"{server.base}/v1/gates/{gid}", headers={"Authorization": f"Bearer {token}"}
        ).json()
        assert view["candidate"] == "vllm/vllm-openai:v0.11.1"
        assert view["reference"] == "vllm/vllm-openai:v0.10.2"
        assert web.results[-1]["report_url"] == f"{server.base}/gates/{gid}"
        # the doc's words: a summary line once decided, null while running
        assert web.results[0]["summary"] is None and web.results[-1]["summary"] == "continue"
        assert set(web.results[0]) >= {"summary", "warnings", "not_shown"}

        # a hold is Failed at once; an errored or cancelled gate is a hold too
        for state in ("complete", "cancelled"):
            server.finish(gid, "hold", state=state)
            again = MetricRun(metric)
            assert again.run(lambda now: (web.measure(), 0.05)) == "Failed"
            assert len(again.timeline) == 1

        # "Running the gate again": the documented key argument makes a new gate, once.
        rerun = next(b for b in yaml_blocks(DOCS / "argo-rollouts.md") if "jsonBody" in b)
        assert rerun["args"][0]["name"] == "gate-run"
        body = substitute(rerun["jsonBody"], {**args, "gate-run": "2"})
        headers = web.headers
        again_ids = [httpx.post(web.url, headers=headers, json=body).json()["id"] for _ in range(2)]
        assert again_ids[0] == again_ids[1] != gid


def test_argo_limits_mean_what_the_doc_says() -> None:
    """The doc's numbers, recomputed with Argo's rules (argo_driver.py): an outage shorter than
    5 minutes never aborts the rollout, about two hours of a running gate before it pauses, and
    the warnings about `interval` and `count`."""
    metric = argo_template()["spec"]["metrics"][0]
    doc = (DOCS / "argo-rollouts.md").read_text()

    def outage(took_s: float) -> tuple[str, float]:
        run = MetricRun(metric)
        phase = run.run(lambda now: ("Error", took_s))
        first = run.timeline[0][0] - took_s
        return phase, run.timeline[-1][0] - first

    phase, fast = outage(0.01)  # connection refused
    assert phase == "Error" and fast >= 300, "an outage shorter than 5 minutes must not abort"
    assert "at least 5 minutes of outage" in doc
    assert f"the 31st comes {fast:.0f} s after the first" in doc
    limit = metric["consecutiveErrorLimit"]
    _, slow = outage(metric["provider"]["web"]["timeoutSeconds"])  # every attempt times out
    assert f"about {slow:.0f} s after it" in doc
    # the numbers the doc gives for the old limit and for Argo's default
    for old, words in ((10, "allowed 100 s"), (None, "is 4: 40 s")):
        m = dict(metric, consecutiveErrorLimit=old)
        r = MetricRun(m)
        r.run(lambda now: ("Error", 0.0))
        assert f"{r.timeline[-1][0]:.0f} s" in words, (old, r.timeline[-1][0])
        assert words in doc
    assert limit == 30

    running = MetricRun(metric)
    assert running.run(lambda now: ("Inconclusive", 0.05)) == "Inconclusive"
    hours = running.timeline[-1][0] / 3600
    assert 1.9 < hours < 2.1 and "about two hours" in doc

    once = MetricRun({k: v for k, v in metric.items() if k != "interval"})
    once.run(lambda now: ("Inconclusive", 0.05))
    assert len(once.timeline) == 1, "a metric without interval is measured once"
    assert "is measured once" in doc

    # `count` lets an all-Inconclusive metric pass only while inconclusiveLimit >= count
    counted = {"interval": "30s", "count": 5, "failureLimit": 0}
    passes = MetricRun({**counted, "inconclusiveLimit": 5})
    assert passes.run(lambda now: ("Inconclusive", 0.0)) == "Successful"
    pauses = MetricRun({**counted, "inconclusiveLimit": 2})
    assert pauses.run(lambda now: ("Inconclusive", 0.0)) == "Inconclusive"
    with_success = MetricRun({**counted, "inconclusiveLimit": 5, "consecutiveSuccessLimit": 1})
    assert with_success.run(lambda now: ("Inconclusive", 0.0)) == "Inconclusive"
    assert "only while `inconclusiveLimit` is at least `count`" in doc


# -- Flagger ---------------------------------------------------------------------------------


def hold_table(doc: str) -> dict[str, tuple[str, str]]:
    """{gate: (Flagger's phase, hooks called)} from the doc's "What you see on a hold" table."""
    section = doc.split("## What you see on a hold", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in section.splitlines()[2:]]
    return {r[0].strip(): (r[1].strip(), r[2].strip()) for r in rows if len(r) >= 3}


def test_flagger_canary_as_written(tmp_path: Path) -> None:
    """The documented Canary's hooks, called by Flagger's scheduler as its code calls them
    (flagger_driver.py), against a real `gate serve` that reads the Canary, its target, its
    primary and their pods from a (fake) Kubernetes API server over HTTP with the official
    client: a new revision, its hold, the fixed revision, its continue and the promotion."""
    canary = next(b for b in yaml_blocks(DOCS / "flagger.md") if b["kind"] == "Canary")
    hooks = canary["spec"]["analysis"]["webhooks"]
    assert {h["type"] for h in hooks} == {"confirm-rollout", "confirm-promotion", "rollback"}
    doc = (DOCS / "flagger.md").read_text()
    table = hold_table(doc)
    fake = FakeKubernetes(store=ObjectStore())
    assert fake.store is not None
    with serve_http(fake) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api)
        env = {
            "GATE_BROKER_URL": BROKER_DOWN,
            "GATE_FLAGGER_CLUSTER": str(kubeconfig),
            "GATE_FLAGGER_NAMESPACES": json.dumps([canary["metadata"]["namespace"]]),
            "GATE_FLAGGER_ANNOTATE": "true",
            # The fake API server answers from this (busy, niced) test process: give the
            # hook's cluster calls the time it may take here (the 8 s default is test_flagger's)
            "GATE_FLAGGER_BUDGET_S": "50",
        }
        with serving(tmp_path, **env) as server:
            token = server.token("flagger", "run")
            for h in hooks:
                h["metadata"]["token"] = token
            answers: list[dict[str, Any]] = []

            def call(kind: str, payload: dict[str, Any]) -> int:
                url = next(h["url"] for h in hooks if h["type"] == kind)
                # Flagger gives a hook 10 s; what the gate guarantees inside it (the cluster
                # calls' shared budget) is test_flagger's. Here the flow is tested, on a machine
                # other tests share: a first answer slowed past 10 s is no wrong answer.
                r = httpx.post(server.base + httpx.URL(url).path, json=payload, timeout=60)
                answers.append(r.json())
                return r.status_code

            repo = "vllm/vllm-openai"
            f = Flagger(
                fake.store,
                call,
                namespace=canary["metadata"]["namespace"],
                name=canary["metadata"]["name"],
                target=canary["spec"]["targetRef"]["name"],
                webhooks=hooks,
                step_weight=canary["spec"]["analysis"]["stepWeight"],
                max_weight=canary["spec"]["analysis"]["maxWeight"],
                digests={f"{repo}:v0.10.2": "sha256:" + "a" * 64},
            )
            f.deploy(f"{repo}:v0.10.2")
            f.initialise()

            f.deploy(f"{repo}:v0.11.0")
            assert f.tick() in table["pending / running"][0]
            held = answers[-1]["id"]
            assert answers[-1]["reference"] == f"{repo}@sha256:{'a' * 64}"
            server.finish(held, "hold")
            phases = f.run(3)
            assert {f"`{p}`" for p in phases} == {table["hold"][0]}
            called = {c[0] for c in f.calls}
            assert called == {"confirm-rollout"}
            assert "never `rollback`" in table["hold"][1]
            annotations = f.canary["metadata"]["annotations"]
            assert annotations["llm-deploy-gate.io/verdict"] == "hold"
            assert [e["reason"] for e in fake.store.items("events", "serving")] == [
                "DeployGateHold"
            ]

            f.deploy(f"{repo}:v0.11.1")  # the fix: a new gate, whatever the checksum
            f.tick()
            fixed = answers[-1]["id"]
            assert fixed != held and answers[-1]["candidate"] == f"{repo}:v0.11.1"
            server.finish(fixed, "continue")
            phases = f.run(8)
            assert phases[0] == "Progressing" and phases[-1] == "Succeeded", phases
            assert table["continue"][0] == "`Progressing`, then `Succeeded`"
            promotions = [c[3] for c in f.calls if c[0] == "confirm-promotion"]
            assert promotions == [200]
            assert f.image(f"{f.target}-primary") == f"{repo}:v0.11.1"
            assert f.canary["metadata"]["annotations"]["llm-deploy-gate.io/verdict"] == "continue"
            assert {a["id"] for a in answers} == {held, fixed}


# -- GitHub Actions ----------------------------------------------------------------------------


def image_allow(doc: Path) -> str:
    """The `GATE_IMAGE_ALLOW=[...]` setting the doc tells the operator to make, as written."""
    m = re.search(r"`GATE_IMAGE_ALLOW=(\[[^`]*\])`", doc.read_text())
    assert m, f"{doc.name} does not say which images to allow"
    return m.group(1)


@contextlib.contextmanager
def gate_server(tmp_path: Path, allow: list[str], doc: Path) -> Iterator[str]:
    """A real `gate serve` with the CI webhook on, callbacks allowed to `allow`, and the
    image allow-list the doc `doc` prescribes."""
    port = free_port()
    env = {
        **os.environ,
        "GATE_IMAGE_ALLOW": image_allow(doc),
        "GATE_DATA_DIR": str(tmp_path / ".gate"),
        "GATE_SPEC_DIR": str(named_specs(tmp_path)),
        "GATE_WEBHOOK_SECRET": SECRET_FOR_DOCS,
        "GATE_CALLBACK_ALLOW": json.dumps(allow),
        "GATE_CALLBACK_TOKEN": "status-writer",
        "GATE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "HOME": str(tmp_path),  # no ~/.kube/config: the kubernetes gate ends in hold at once
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "gate", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(f"{base}/metrics", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


SECRET_FOR_DOCS = "doc-test-secret"


def run_script(script: str, env: dict[str, str]) -> Any:
    """A documented CI script in bash, as the CI system runs it; its JSON answer."""
    done = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def first_status(receiver: Any) -> tuple[dict[str, str], dict[str, Any]]:
    deadline = time.monotonic() + 60
    while not receiver.calls and time.monotonic() < deadline:
        time.sleep(0.2)
    assert receiver.calls, "no commit status arrived"
    return receiver.calls[0]  # type: ignore[no-any-return]


def test_github_actions_step_as_written(tmp_path: Path, receiver: Any) -> None:
    for tool in ("bash", "jq", "openssl", "curl"):
        assert shutil.which(tool), f"{tool} is needed to run the documented step"
    workflow = yaml_blocks(DOCS / "github-actions.md")[0]
    step = workflow["jobs"]["gate"]["steps"][0]
    with gate_server(tmp_path, [f"{receiver.url}/repos/acme/"], DOCS / "github-actions.md") as base:
        step_env = {
            k: str(v)
            .replace("${{ secrets.GATE_WEBHOOK_SECRET }}", SECRET_FOR_DOCS)
            .replace("${{ github.sha }}", "abc123")
            for k, v in step["env"].items()
        }
        step_env["GATE_URL"] = base
        github = {
            "GITHUB_REPOSITORY": "acme/llm",
            "GITHUB_RUN_ID": "42",
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_SHA": "abc123",
            "GITHUB_API_URL": receiver.url,
        }
        accepted = run_script(step["run"], {**step_env, **github})
        assert accepted["duplicate"] is False
        gid = accepted["gate"]["id"]
        # the step retried within the same job attempt: the same delivery with a fresh
        # timestamp, signed anew; the first gate comes back and nothing new starts
        retried = run_script(step["run"], {**step_env, **github})
        assert retried["duplicate"] is True and retried["gate"]["id"] == gid
        headers, status = first_status(receiver)
        assert headers["Authorization"] == "Bearer status-writer"
        assert status["context"] == "llm-deploy-gate"
        assert status["state"] == "failure"  # no cluster here: the gate holds
        assert status["target_url"] == f"{base}/gates/{gid}"
        assert receiver.paths == ["/repos/acme/llm/statuses/abc123"]


def test_gitlab_ci_job_as_written(tmp_path: Path, receiver: Any) -> None:
    for tool in ("bash", "jq", "openssl", "curl"):
        assert shutil.which(tool), f"{tool} is needed to run the documented job"
    job = yaml_blocks(DOCS / "gitlab-ci.md")[0]["deploy-gate"]
    gitlab = {
        "CI_PROJECT_PATH": "acme/llm",
        "CI_PROJECT_ID": "7",
        "CI_PIPELINE_ID": "1001",
        "CI_JOB_ID": "5005",
        "CI_COMMIT_SHA": "abc123",
        "CI_REGISTRY_IMAGE": "registry.gitlab.example/acme/llm",
        "CI_API_V4_URL": f"{receiver.url}/api/v4",
        "GATE_WEBHOOK_SECRET": SECRET_FOR_DOCS,  # a masked CI/CD variable
    }
    with gate_server(tmp_path, [f"{receiver.url}/api/v4/projects/"], DOCS / "gitlab-ci.md") as base:
        # GitLab expands the job's variables with its predefined ones before the script runs
        variables = {k: str(v) for k, v in job["variables"].items()}
        for name, value in variables.items():
            for var, real in gitlab.items():
                value = value.replace(f"${var}", real)
            variables[name] = value
        variables["GATE_URL"] = base
        assert variables["CANDIDATE_IMAGE"] == "registry.gitlab.example/acme/llm/vllm-openai:abc123"
        (script,) = job["script"]
        accepted = run_script("set -euo pipefail\n" + script, {**gitlab, **variables})
        gid = accepted["gate"]["id"]
        assert accepted["duplicate"] is False and accepted["delivery_id"] == "acme/llm/1001/5005"
        headers, status = first_status(receiver)
        # GitLab's commit-status API: POST /projects/:id/statuses/:sha, state `failed`, `name`
        assert receiver.paths == ["/api/v4/projects/7/statuses/abc123"]
        assert headers["Authorization"] == "Bearer status-writer"
        assert status == {
            "state": "failed",
            "name": "llm-deploy-gate",
            "description": status["description"],
            "target_url": f"{base}/gates/{gid}",
        }
        assert status["description"].startswith("hold: ")  # the gate's summary line
