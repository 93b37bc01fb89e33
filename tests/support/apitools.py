"""Helpers for API tests: sim-engine specs, auth headers, polling."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import yaml
from fastapi.testclient import TestClient

from gate.core.settings import Settings

SECRET = "test-webhook-secret"


SIM_ARGV = [sys.executable, "-m", "simengine", "--port", "{port}", "--model", "{model}"]
SIM_TEMPLATE: dict[str, Any] = {
    "description": "the simulated engine, as an operator would offer it to API callers",
    "engine": {
        "command": [*SIM_ARGV, "--tag", "{tag}", "--seed", "{seed}", "--ttft-ms", "{ttft_ms}"]
    },
    "params": {
        "tag": {"type": "string", "pattern": "[a-z0-9-]{1,40}"},
        "seed": {"type": "int", "min": 0, "max": 1000, "default": 1},
        "ttft_ms": {"type": "number", "min": 1, "max": 10_000, "default": 20},
    },
}


def sim_engine(tag: str, *flags: str) -> dict[str, Any]:
    """A caller's engine: the `sim` template with its parameters (`--seed N`, `--ttft-ms X`)."""
    params: dict[str, Any] = {"tag": tag}
    names = {"--seed": ("seed", int), "--ttft-ms": ("ttft_ms", float)}
    it = iter(flags)
    for flag in it:
        name, kind = names[flag]  # a flag the template does not offer is a test mistake
        params[name] = kind(next(it))
    return {"engine": "sim", "params": params}


def sim(tag: str, *flags: str) -> dict[str, Any]:
    """An operator's engine (a named spec or the command line): the argv as written."""
    return {"command": [*SIM_ARGV, "--tag", tag, *flags]}


def spec_dict(
    tag: str,
    *,
    cand_flags: tuple[str, ...] = (),
    requests: int = 120,
    rate: float = 40.0,
    trusted: bool = False,
    short_ok: bool = True,
) -> dict[str, Any]:
    """A gate spec as a caller sends it (engines from the `sim` template), or, `trusted`, as
    the operator writes one (a named spec in GATE_SPEC_DIR: argv engines).

    Its default scenario (120 requests at 40/s, 3 s) is too short for the paired latency
    checks (fewer than 8 time blocks of 2 s), which the plan refuses as a spec mistake; most
    API tests are about the API, not the verdict, so the spec allows it (`policy:
    short_scenarios: allow`: the latency checks are left undecided). `short_ok=False` leaves
    the policy out: a test of the verdict gives a scenario long enough (`DECIDES`)."""
    engine = sim if trusted else sim_engine
    policy = {"policy": {"short_scenarios": "allow"}} if short_ok else {}
    return {
        "name": "api-test",
        "model": "demo-model",
        "reference": engine(tag, "--ttft-ms", "20", "--seed", "1"),
        "candidate": engine(tag, "--ttft-ms", "20", "--seed", "2", *cand_flags),
        "shape": {"sku": "H200", "gpus_per_engine": 1},
        "scenarios": [
            {
                "name": "steady",
                "arrival": "poisson",
                "rate": rate,
                "requests": requests,
                "prompt_tokens": 32,
                "max_tokens": 8,
            }
        ],
        **policy,
    }


# A steady scenario long enough for the paired latency checks to decide (about 18 s: 9 time
# blocks of 2 s, the plan's least is 8), at a rate that keeps the requests few.
DECIDES: dict[str, Any] = {"requests": 432, "rate": 24.0, "short_ok": False}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for(
    predicate: Callable[[], Any], timeout: float = 90.0, every: float = 0.2, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def poll_finished(client: TestClient, gate_id: str, token: str, timeout: float = 120) -> Any:
    def done() -> Any:
        body = client.get(f"/v1/gates/{gate_id}", headers=auth(token)).json()
        return body if body["state"] in ("complete", "error", "cancelled") else None

    return wait_for(done, timeout, what=f"gate {gate_id} to finish")


def write_named_spec(settings: Settings, name: str, doc: dict[str, Any]) -> None:
    assert settings.spec_dir is not None
    (settings.spec_dir / f"{name}.yaml").write_text(yaml.safe_dump(doc))


class Recording:
    """A dispatcher that keeps the gates it is handed and runs none (fuzzed or documented
    requests must never launch engines)."""

    kind = "recording"

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(self, gate_id: str) -> None:
        self.submitted.append(gate_id)

    def queue_depth(self) -> int | None:
        return len(self.submitted)

    def close(self) -> None:
        return None
