"""API tokens with scopes. Only a token's SHA-256 is stored; the token is shown once, when it
is made. Scopes nest: admin includes run, run includes read."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gate.core.clock import now
from gate.core.database import transaction
from gate.core.errors import TokenError as TokenError  # it lived here: re-exported
from gate.models import ApiToken

SCOPES = ("read", "run", "admin")
PREFIX = "gt_"
CACHE_S = 5.0


def expand(scopes: Iterable[str]) -> frozenset[str]:
    """The scopes a token really has: each scope brings the ones below it."""
    out: set[str] = set()
    for s in scopes:
        if s not in SCOPES:
            raise TokenError(f"scopes: unknown scope {s!r}; use read, run or admin")
        out.update(SCOPES[: SCOPES.index(s) + 1])
    return frozenset(out)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(factory: sessionmaker[Session], name: str, scopes: Iterable[str]) -> str:
    scope_list = sorted(expand(scopes), key=SCOPES.index)
    if not scope_list:
        raise TokenError("scopes: give at least one of read, run, admin")
    token = PREFIX + secrets.token_urlsafe(32)
    with transaction(factory) as s:
        s.add(ApiToken(name=name, token_hash=digest(token), scopes=",".join(scope_list)))
    return token


def revoke(factory: sessionmaker[Session], name: str) -> int:
    with transaction(factory) as s:
        return len(
            s.scalars(
                update(ApiToken)
                .where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                .values(revoked_at=now())
                .returning(ApiToken.id)
            ).all()
        )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What `gate token list` shows of a token: never the token, never its hash."""

    id: int
    name: str
    scopes: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def list_tokens(factory: sessionmaker[Session], *, revoked: bool = False) -> list[TokenInfo]:
    """The tokens in the order they were made; revoked ones only when asked."""
    query = select(ApiToken).order_by(ApiToken.id)
    if not revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    with transaction(factory) as s:
        return [
            TokenInfo(t.id, t.name, t.scopes, t.created_at, t.last_used_at, t.revoked_at)
            for t in s.scalars(query)
        ]


class TokenChecker:
    """Looks tokens up by hash, with a short cache so that pollers do not hit the database on
    every request (a revoked token stops working within CACHE_S seconds)."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory
        self._cache: OrderedDict[str, tuple[float, frozenset[str] | None, int | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def cached(self, token: str) -> tuple[bool, frozenset[str] | None]:
        """(known, scopes) from the cache alone: known False means ask `scopes`."""
        if not token.startswith(PREFIX) or len(token) > 200:
            return True, None
        with self._lock:
            hit = self._cache.get(digest(token))
        if hit is not None and time.monotonic() - hit[0] < CACHE_S:
            return True, hit[1]
        return False, None

    def token_id(self, token: str) -> int | None:
        """The id of the token's row (who asked, for owning gates and scoping keys)."""
        return self._entry(token)[1]

    def scopes(self, token: str) -> frozenset[str] | None:
        return self._entry(token)[0]

    def _entry(self, token: str) -> tuple[frozenset[str] | None, int | None]:
        """(scopes, id) of a live token, from the cache or from one query that refills it."""
        if not token.startswith(PREFIX) or len(token) > 200:
            return None, None
        h = digest(token)
        with self._lock:
            hit = self._cache.get(h)
        if hit is not None and time.monotonic() - hit[0] < CACHE_S:
            return hit[1], hit[2]
        t = time.monotonic()
        with transaction(self.factory) as s:
            row = s.scalars(
                select(ApiToken).where(ApiToken.token_hash == h, ApiToken.revoked_at.is_(None))
            ).first()
            scopes = frozenset(row.scopes.split(",")) if row is not None else None
            token_id = row.id if row is not None else None
            if row is not None:
                row.last_used_at = now()
        with self._lock:
            # least recently stored first out: a flood of made-up tokens evicts old entries
            # one by one instead of emptying the cache of every poller's token
            self._cache.pop(h, None)
            while len(self._cache) >= 10_000:
                self._cache.popitem(last=False)
            self._cache[h] = (t, scopes, token_id)
        return scopes, token_id
