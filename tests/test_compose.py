"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the Compose schema
(../shared/schemas, never copied), every command parsed by the project's own argument
parsers, every GATE_* variable a real setting with a valid value, healthchecks that probe
what the services really serve, and the try-out spec pointing at the compose sim engines."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from sqlalchemy.engine import make_url

from gate.cli import _parser
from gate.core.settings import Settings
from gate.spec import load_spec
from gate.worker.main import alive_file
from simengine.cli import parse_args as sim_args

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"
SIM = ["python", "-m", "simengine"]
GATE_SERVICES = ("api", "worker", "sim-reference", "sim-candidate")
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")


@functools.cache
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved as Compose does
    assert isinstance(doc, dict)
    return doc


def services() -> dict[str, dict[str, Any]]:
    svcs = compose()["services"]
    assert isinstance(svcs, dict)
    return svcs


def command(name: str) -> list[str]:
    cmd = services()[name]["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]


def environment(name: str) -> dict[str, str]:
    env = services()[name].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def dockerfile_env() -> dict[str, str]:
    """ENV lines of the Dockerfile (KEY=value pairs, continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """What the service's process would read: the image's ENV, then the service's own."""
    for key in list(os.environ):
        if key.startswith("GATE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def healthcheck_code(name: str) -> str:
    test = services()[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    code = str(test[3])
    compile(code, f"{name} healthcheck", "exec")
    return code


def test_compose_file_is_valid_against_the_compose_schema() -> None:
    if not SCHEMA.exists():
        msg = f"the Compose schema is not at {SCHEMA} (../shared/schemas is not checked out)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(compose()), key=lambda e: e.json_path
    )
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)
    # What the schema leaves to the engine: durations, and dependencies that exist.
    for name, svc in services().items():
        for key in ("interval", "timeout", "start_period"):
            value = svc.get("healthcheck", {}).get(key)
            assert value is None or DURATION.match(value), (name, key, value)
        grace = svc.get("stop_grace_period")
        assert grace is None or DURATION.match(grace), (name, grace)
        for dep in svc.get("depends_on", {}):
            assert dep in services(), f"{name} depends on a missing service {dep}"


def test_the_services_of_a_scale_out() -> None:
    assert {"postgres", "redis", *GATE_SERVICES} <= set(services())
    for name in ("postgres", "redis", *GATE_SERVICES):
        assert services()[name]["healthcheck"]["test"], f"{name} has no healthcheck"
    for name in GATE_SERVICES:
        assert services()[name]["build"] == "."
        assert services()[name]["image"] == services()["api"]["image"]
    # Workers scale with --scale: nothing that names one container or one host port.
    assert "container_name" not in services()["worker"]
    assert "ports" not in services()["worker"]


def test_every_gate_command_is_a_real_one() -> None:
    parser = _parser()
    api = parser.parse_args(command("api")[1:])
    assert command("api")[0] == "gate" and api.command == "serve"
    assert api.host == "0.0.0.0"
    assert services()["api"]["ports"] == [f"{api.port}:{api.port}"]
    assert f"http://127.0.0.1:{api.port}/v1/openapi.json" in healthcheck_code("api")

    worker = parser.parse_args(command("worker")[1:])
    assert command("worker")[0] == "gate" and worker.command == "worker"
    assert worker.concurrency >= 1

    image_cmd = json.loads(re.findall(r"^CMD (\[.*\])$", DOCKERFILE.read_text(), re.M)[-1])
    assert image_cmd[0] == "gate" and parser.parse_args(image_cmd[1:]).command == "serve"


def test_the_sim_engines_run_with_real_flags() -> None:
    seen = {}
    for name in ("sim-reference", "sim-candidate"):
        argv = command(name)
        assert argv[:3] == SIM, argv
        config = sim_args(argv[3:])  # the sim's own parser and range checks
        assert config.host == "0.0.0.0"
        assert f"http://127.0.0.1:{config.port}/health" in healthcheck_code(name)
        seen[name] = config
    ref, cand = seen["sim-reference"], seen["sim-candidate"]
    assert ref.model == cand.model
    assert cand.ttft_ms > ref.ttft_ms  # the try-out's candidate carries a TTFT regression


def test_every_gate_variable_is_a_real_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f"GATE_{name.upper()}" for name in Settings.model_fields}
    image_env = dockerfile_env()
    for name in services():
        env = environment(name)
        unknown = sorted(k for k in env if k.startswith("GATE_") and k not in fields)
        assert not unknown, f"{name}: not settings: {unknown}"
        if name in GATE_SERVICES:
            settings_from({**image_env, **env}, monkeypatch)  # values parse, too
    unknown = sorted(k for k in image_env if k.startswith("GATE_") and k not in fields)
    assert not unknown, f"Dockerfile: not settings: {unknown}"


def test_api_and_workers_share_one_database_and_one_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image_env = dockerfile_env()
    api = settings_from({**image_env, **environment("api")}, monkeypatch)
    worker = settings_from({**image_env, **environment("worker")}, monkeypatch)
    assert api.database_url == worker.database_url is not None
    assert api.broker_url == worker.broker_url is not None
    assert api.data_dir == worker.data_dir
    for key in ("heartbeat_s", "lost_after_s", "broker_visibility_timeout_s"):
        assert getattr(api, key) == getattr(worker, key), key

    db = make_url(worker.database_url)
    pg = environment("postgres")
    assert (db.drivername, db.host, db.port) == ("postgresql+psycopg", "postgres", 5432)
    assert (db.username, db.password, db.database) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    broker = urlsplit(worker.broker_url)
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    for name in ("api", "worker"):
        assert {"postgres", "redis"} <= set(services()[name]["depends_on"])
    # The worker's health is the age of the file its reaper touches.
    path = alive_file(worker)
    assert str(path.parent) + "/" in healthcheck_code("worker")
    assert path.suffix in healthcheck_code("worker")
    assert worker.lost_after_s <= 30 < worker.broker_visibility_timeout_s
    assert any(v.endswith(f":{worker.data_dir}") for v in services()["worker"]["volumes"])


def test_the_image_has_what_the_services_need(monkeypatch: pytest.MonkeyPatch) -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert "pip install ." in text
    for line in text.splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("pyproject.toml", "README.md", "gate", "loadgen", "migrations", "examples"):
        assert needed not in ignored
    image = settings_from(dockerfile_env(), monkeypatch)
    # /app in the image is the repository root here.
    assert image.inventory is not None and image.spec_dir is not None
    assert (ROOT / image.inventory.relative_to("/app")).is_file()
    assert (ROOT / image.spec_dir.relative_to("/app") / "compose.yaml").is_file()


def test_the_try_out_spec_attaches_to_the_compose_sims() -> None:
    spec = load_spec(ROOT / "examples" / "specs" / "compose.yaml")
    for role, service in (("reference", "sim-reference"), ("candidate", "sim-candidate")):
        engine = getattr(spec, role)
        assert engine.url is not None, f"{role} must attach by url"
        url = urlsplit(engine.url)
        config = sim_args(command(service)[3:])
        assert (url.hostname, url.port) == (service, config.port)
        assert spec.model == config.model
