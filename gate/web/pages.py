"""Report pages (issue 9): placeholder router, filled in by the pages work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(include_in_schema=False)
