"""A spec's history (`/v1/history`): the spec identities with finished gates, and one
identity's gates page by page, thin over gate/service/history.py."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query

from gate.api.gates import ERRORS, NOT_FOUND
from gate.http.deps import CtxDep, ReadDep
from gate.service import history
from gate.service.schemas import HistoryList, HistoryPage

router = APIRouter(tags=["history"])

Identity = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="a spec identity")]


@router.get(
    "/history",
    response_model=HistoryList,
    responses=ERRORS,
    summary="Spec identities (name, model, shape) with finished gates, most recent first",
)
def identities(
    ctx: CtxDep,
    _: ReadDep,
    limit: Annotated[int, Query(ge=1, le=history.MAX_HISTORY_SPECS)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> HistoryList:
    return history.spec_histories(ctx.factory, limit, offset)


@router.get(
    "/history/{identity}",
    response_model=HistoryPage,
    responses={**ERRORS, **NOT_FOUND},
    summary="One spec identity's gates, newest first: reference figures, ratios, verdicts",
)
def identity_history(
    identity: Identity,
    ctx: CtxDep,
    _: ReadDep,
    limit: Annotated[int, Query(ge=1, le=history.MAX_HISTORY_PAGE)] = 50,
    before: Annotated[
        datetime | None,
        Query(description="the previous page's `next_before`: gates finished before it"),
    ] = None,
) -> HistoryPage:
    return history.spec_history(ctx.factory, identity, limit, before)
