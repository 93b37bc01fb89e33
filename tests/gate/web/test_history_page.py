"""The history page in a real headless Chromium: 24 gates of one spec, stored from a real
short sim gate's document (tests/support/captures/history/sim-gate.json, copied by
tests/support/history.py with its reference moved a little, on two hosts), the reference's TTFT
drifting up over the last four and flagged by the same comparison a run makes. The page must
draw the charts (SVG, no script: the CSP allows none here), ring the flagged gates, say the A/A
hold rate, and take its screenshot for the README (docs/img/history.png is a copy of it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import (
    HEADINGS_JS,
    Watch,
    artifacts_dir,
    assert_headings,
    chromium,
    chromium_path,
    serve,
)
from history import seed_history
from services import service_missing

from gate.api.app import create_app
from gate.core.settings import Settings
from gate.spec import parse_spec
from gate.spec.identity import spec_identity
from gate.verdict.document import VerdictDocument

CAPTURE = Path(__file__).resolve().parents[2] / "support" / "captures" / "history" / "sim-gate.json"
GATES = 24
DRIFT_FROM = 20  # the last four gates: the test bed slows by 20%, 45%, 70%, 95%


@pytest.fixture(scope="module")
def exe() -> str:
    path, why = chromium_path()
    if path is None:
        service_missing("Chromium", why)
    assert path is not None
    return path


@pytest.fixture
def site(tmp_path: Path, exe: str) -> Iterator[tuple[str, str]]:
    captured = json.loads(CAPTURE.read_text())
    spec = parse_spec(captured["spec"])
    app = create_app(Settings(data_dir=tmp_path / ".gate", open_reads=True), start_workers=False)
    drift = [1.0] * DRIFT_FROM + [1.2, 1.45, 1.7, 1.95]
    seed_history(
        app.state.ctx.factory,
        spec,
        VerdictDocument.read(captured["document"]),
        GATES,
        drift=lambda i: drift[i],
    )
    with serve(app) as server:
        yield server.url, spec_identity(spec)


def test_the_history_page_shows_a_drifting_reference(site: tuple[str, str], exe: str) -> None:
    url, identity = site
    with chromium(exe) as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        watch = Watch().attach(pg)
        pg.goto(f"{url}/history")
        pg.locator(f'a[href="/history/{identity}"]').click()
        assert pg.title().startswith("History of history-demo")
        charts = pg.eval_on_selector_all(
            "svg.chart[role=img]",
            "els => els.map(e => [e.dataset.chart, e.getAttribute('aria-label')])",
        )
        kinds = [k for k, _ in charts]
        assert kinds == ["verdicts", "reference", "reference", "ratios"], kinds
        ttft = next(label for k, label in charts if k == "reference" and "TTFT" in label)
        assert f"{GATES} gates" in ttft and "points flagged as reference outliers" in ttft
        # The drift is flagged where it leaves the history (at least the last three gates'
        # p50), never on the steady stretch before it.
        rings = pg.locator('svg[data-chart="reference"] circle.flagged')
        assert rings.count() >= 3
        flagged_rows = pg.locator("table.gates tbody tr").filter(has_text="steady.ttft_ms.p50")
        assert 3 <= flagged_rows.count() <= GATES - DRIFT_FROM
        assert pg.locator("#aa-rate").inner_text() == "0%"
        assert pg.locator("table.gates tbody tr").count() == GATES
        assert_headings(pg.evaluate(HEADINGS_JS))
        assert pg.evaluate("() => document.scripts.length") == 0
        shot = artifacts_dir() / "history.png"
        pg.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 20_000
        watch.assert_clean()
        context.close()
    print(f"history page screenshot: {shot}")
