"""What docs/ ships for monitoring the gate: the Grafana dashboard (docs/grafana/) validated
against Grafana's dashboard JSON schema, and the Prometheus alerting rules
(docs/prometheus/gate-alerts.yaml) checked and unit-tested by Prometheus's own `promtool`
(Debian's `prometheus` package; .ci/run installs it). Both may only name series the service's
/metrics really serves, read from a real scrape.

The schema is tests/support/grafana/dashboard.jsonschema.json, vendored unchanged from
grafana/grafana-foundation-sdk (Apache-2.0) `jsonschema/dashboard.jsonschema.json` at commit
f178d5a42a8915fdda9235e97ad93881e3f94fef (last changed in b3d52a7cbaffff15aeada9a7dbc55be1a417bdab):
Grafana's JSON Schema (draft-07) of the dashboard kind, generated from the kind's CUE
(grafana/grafana kinds/dashboard, the classic JSON model: panels, templating, annotations).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from fastapi.testclient import TestClient
from services import service_missing

from gate.api.app import create_app
from gate.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "llm-deploy-gate.json"
RULES = ROOT / "docs" / "prometheus" / "gate-alerts.yaml"
RULE_TESTS = ROOT / "tests" / "support" / "prometheus" / "gate-alerts-test.yaml"
# the weekly rule's tests, evaluated hourly (the file says why)
WEEKLY_TESTS = RULE_TESTS.with_name("gate-alerts-weekly-test.yaml")
SCHEMA = ROOT / "tests" / "support" / "grafana" / "dashboard.jsonschema.json"
PROMQL_WORDS = {
    "sum",
    "by",
    "max",
    "min",
    "increase",
    "rate",
    "histogram_quantile",
    "and",
    "or",
    "le",
    "label_values",
    "without",
    "on",
    "count",
}


def problems(dashboard: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(dashboard)]


def test_the_dashboard_fits_grafanas_schema() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert problems(dashboard) == []
    assert len(dashboard["panels"]) >= 8
    # The validator is strict where it matters: a stray key, a panel without a type.
    broken = copy.deepcopy(dashboard)
    broken["colour"] = "blue"
    del broken["panels"][0]["type"]
    found = problems(broken)
    assert any("colour" in p for p in found) and len(found) >= 2


def served_series(tmp_path: Path) -> set[str]:
    """Every series name a fresh service's /metrics declares (histograms and counters with the
    suffixes Prometheus stores them under)."""
    app = create_app(Settings(data_dir=tmp_path / ".gate", open_metrics=True))
    with TestClient(app) as client:
        text = client.get("/metrics").text
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names |= {
                f"{name}_bucket",
                f"{name}_sum",
                f"{name}_count",
                f"{name}_gsum",
                f"{name}_gcount",
            }
    return names


def named_series(expr: str) -> set[str]:
    bare = re.sub(r"\b(by|without) \([^)]*\)|\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    return {w for w in re.findall(r"[a-z_][a-z0-9_]*", bare) if w not in PROMQL_WORDS}


def test_the_dashboard_and_the_rules_name_only_served_series(tmp_path: Path) -> None:
    served = served_series(tmp_path)
    assert {"gate_finished_gates_total", "gate_check_ratio_bucket", "gate_checks"} <= served
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    exprs += [r["expr"] for r in rules]
    missing = {(name, e) for e in exprs for name in named_series(e) - served}
    assert not missing, missing
    assert {r["alert"] for r in rules} == {"GateHeld", "GateStuck", "GateAAHoldsTooOften"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        service_missing("promtool", "Debian's prometheus package is not installed")
    assert found is not None
    return found


def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 3 rules found" in checked.stdout, checked
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name, WEEKLY_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == 2, tested.stdout


def test_promtool_fails_a_rule_that_misfires(tmp_path: Path) -> None:
    """The unit tests can fail: the hold alert with its threshold raised stays silent, and
    promtool says the expected alert is missing."""
    tool = promtool()
    rules = tmp_path / "docs" / "prometheus"
    rules.mkdir(parents=True)
    (rules / "gate-alerts.yaml").write_text(RULES.read_text().replace("[15m])) > 0", "[15m])) > 5"))
    tests_dir = tmp_path / "tests" / "support" / "prometheus"
    tests_dir.mkdir(parents=True)
    shutil.copy(RULE_TESTS, tests_dir / RULE_TESTS.name)
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name], cwd=tests_dir, capture_output=True, text=True
    )
    assert tested.returncode != 0 and "GateHeld" in tested.stdout + tested.stderr
