"""Property-based API testing: schemathesis generates requests from our OpenAPI document
(valid and invalid bodies, odd paths and queries) and no request may get a 5xx, and every
answer must be one the document declares. Nothing is launched: the dispatcher records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from apitools import Recording
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings


def _app(tmp: Path) -> Any:
    specs = tmp / "specs"
    specs.mkdir(parents=True, exist_ok=True)
    app = create_app(
        Settings(
            data_dir=tmp / ".gate",
            spec_dir=specs,
            webhook_secret="fuzz-secret",
            max_body_bytes=200_000,
        ),
        start_workers=False,
    )
    app.state.ctx.dispatcher = Recording()
    return app


_TMP = Path(__import__("tempfile").mkdtemp(prefix="gate-fuzz-"))
APP = _app(_TMP)
TOKEN = create_token(APP.state.ctx.factory, "fuzz", ["admin"])
schema = schemathesis.openapi.from_asgi("/v1/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    import shutil

    shutil.rmtree(_TMP, ignore_errors=True)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_5xx_and_answers_match_the_document(case: Any) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[not_a_server_error, content_type_conformance, response_schema_conformance],
    )
