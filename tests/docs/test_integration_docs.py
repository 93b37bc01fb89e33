"""The integration docs work as written: the Argo Rollouts AnalysisTemplate is sent to the
real API the way Argo's web provider sends it and its conditions and limits are applied as Argo
applies them; the GitHub Actions step's script runs in bash against a real `gate serve`."""

from __future__ import annotations

import contextlib
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
from apitools import Recording
from fastapi.testclient import TestClient

from gate.api.app import create_app
from gate.core.database import transaction
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


def test_argo_analysis_template_as_written(tmp_path: Path) -> None:
    template = next(
        b for b in yaml_blocks(DOCS / "argo-rollouts.md") if b["kind"] == "AnalysisTemplate"
    )
    metric = template["spec"]["metrics"][0]
    web = metric["provider"]["web"]
    assert "count" not in metric  # see the doc: a count would let an undecided gate pass
    settings = Settings(data_dir=tmp_path / ".gate", spec_dir=named_specs(tmp_path))
    app = create_app(settings, start_workers=False)
    recording = Recording()
    app.state.ctx.dispatcher = recording
    from gate.access.tokens import create_token

    token = create_token(app.state.ctx.factory, "argo-rollouts", ["run"])
    args = {"candidate-image": "vllm/vllm-openai:v0.11.1", "gate-token": token}
    url = httpx.URL(substitute(web["url"], args))
    headers = {h["key"]: substitute(h["value"], args) for h in web["headers"]}
    body = substitute(web["jsonBody"], args)
    assert web["jsonPath"] == "{$}"

    def measure(client: TestClient) -> tuple[str, dict[str, Any]]:
        r = client.request(web["method"], url.path, headers=headers, json=body)
        assert r.status_code == 200, r.text  # non-2xx would be an Argo Error measurement
        result = r.json()
        if condition(metric["failureCondition"], result):
            return "Failed", result
        if condition(metric["successCondition"], result):
            return "Successful", result
        return "Inconclusive", result

    with TestClient(app) as client:
        phases = [measure(client) for _ in range(3)]
        assert [p for p, _ in phases] == ["Inconclusive"] * 3
        ids = {r["id"] for _, r in phases}
        assert len(ids) == 1 and len(recording.submitted) == 1  # polling starts one gate
        gid = ids.pop()
        assert metric["inconclusiveLimit"] >= 3
        run = client.get(f"/v1/gates/{gid}", headers=headers).json()
        assert run["candidate"] == "vllm/vllm-openai:v0.11.1"
        assert run["reference"] == "vllm/vllm-openai:v0.10.2"

        def finish(verdict: str, state: str = "complete") -> None:
            with transaction(app.state.ctx.factory) as s:
                row = s.get(GateRun, gid)
                assert row is not None
                row.state, row.verdict, row.reason = state, verdict, f"gate said {verdict}"

        finish("continue")
        phase, result = measure(client)
        assert phase == "Successful"
        assert metric["consecutiveSuccessLimit"] == 1  # one success ends the metric
        assert result["report_url"].endswith(f"/gates/{gid}")
        finish("hold")
        assert measure(client)[0] == "Failed"
        assert metric["failureLimit"] == 0  # one failure aborts the rollout
        finish("hold", state="cancelled")
        phase, result = measure(client)
        assert (phase, result["state"]) == ("Failed", "error")

        # "Running the gate again": the documented key argument makes a new gate, once.
        rerun = next(b for b in yaml_blocks(DOCS / "argo-rollouts.md") if "jsonBody" in b)
        assert rerun["args"][0]["name"] == "gate-run"
        body = substitute(rerun["jsonBody"], {**args, "gate-run": "2"})
        again = [client.post(url.path, headers=headers, json=body).json() for _ in range(2)]
        assert again[0]["id"] == again[1]["id"] != gid
        assert again[0]["state"] == "pending" and len(recording.submitted) == 2


# -- Flagger ---------------------------------------------------------------------------------


def test_flagger_canary_webhooks_as_written(tmp_path: Path) -> None:
    """Each webhook of the documented Canary, called the way Flagger calls it (its payload,
    its metadata, the token from metadata), answers what the doc's table says."""
    canary = next(b for b in yaml_blocks(DOCS / "flagger.md") if b["kind"] == "Canary")
    hooks = {h["type"]: h for h in canary["spec"]["analysis"]["webhooks"]}
    assert set(hooks) == {"confirm-rollout", "rollback"}
    settings = Settings(data_dir=tmp_path / ".gate", spec_dir=named_specs(tmp_path))
    app = create_app(settings, start_workers=False)
    recording = Recording()
    app.state.ctx.dispatcher = recording
    from gate.access.tokens import create_token

    token = create_token(app.state.ctx.factory, "flagger", ["run"])

    def call(kind: str, checksum: str = "rev-1") -> Any:
        hook = hooks[kind]
        metadata = {k: (token if k == "token" else str(v)) for k, v in hook["metadata"].items()}
        payload = {
            "name": canary["metadata"]["name"],
            "namespace": canary["metadata"]["namespace"],
            "phase": "Progressing",
            "checksum": checksum,
            "metadata": metadata,
        }
        return client.post(httpx.URL(hook["url"]).path, json=payload)

    with TestClient(app) as client:
        pending = call("confirm-rollout")
        assert pending.status_code == 403 and "pending" in pending.text
        assert call("rollback").status_code == 403
        assert len(recording.submitted) == 1  # both hooks, one revision: one gate
        (gid,) = recording.submitted
        run = client.get(f"/v1/gates/{gid}", headers={"Authorization": f"Bearer {token}"})
        assert run.json()["candidate"] == hooks["confirm-rollout"]["metadata"]["candidate_image"]

        def finish(verdict: str) -> None:
            with transaction(app.state.ctx.factory) as s:
                row = s.get(GateRun, gid)
                assert row is not None
                row.state, row.verdict, row.reason = "complete", verdict, f"gate said {verdict}"

        finish("hold")
        refused = call("confirm-rollout")
        assert refused.status_code == 403 and "gate said hold" in refused.text
        assert call("rollback").status_code == 200
        finish("continue")
        assert call("confirm-rollout").status_code == 200
        assert call("rollback").status_code == 403
        call("confirm-rollout", checksum="rev-2")  # a new revision: a new gate
        assert len(recording.submitted) == 2


# -- GitHub Actions ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        assert status["description"].startswith("gate hold: ")
