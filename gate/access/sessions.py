"""Sign-in sessions of the report pages. The browser's cookie carries a random secret, never
the API token it signed in with: a stolen cookie is one browser's session, bounded in time and
in scope, not the token. Only the secret's SHA-256 is stored (like tokens). A session has the
`read` scope, plus `run` when the sign-in form asked for it and the token has it; never admin.
It ends when it expires, when the browser signs out, or when its token is revoked (the lookup
joins the token row, so revoking a token ends every session made from it).

Each session also holds a CSRF token: a state-changing request signed in by the cookie must
carry it (gate/http/guards.py), because a browser sends cookies on cross-site requests too."""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from gate.access.tokens import SCOPES, digest
from gate.core.clock import now
from gate.core.database import transaction
from gate.models import ApiToken, WebSession

PREFIX = "gs_"
CACHE_S = 5.0  # like TokenChecker: a revoked token's sessions stop within this many seconds
BROWSER_SCOPES = ("read", "run")  # a browser session never gets admin


@dataclass(frozen=True, slots=True)
class BrowserSession:
    id: int
    token_id: int
    scopes: frozenset[str]
    csrf: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class NewSession:
    secret: str  # goes in the cookie, nowhere else
    session: BrowserSession


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)  # SQLite hands back naive UTC


def _scopes(text: str) -> frozenset[str]:
    return frozenset(s for s in text.split(",") if s)


def create_session(
    factory: sessionmaker[Session], token: str, *, allow_run: bool, max_age_s: float
) -> NewSession | None:
    """A session for a browser that presented `token`; None when the token is unknown,
    revoked or lacks `read`. Expired sessions are swept out here, a few at each sign-in."""
    h = digest(token)
    with transaction(factory) as s:
        row = s.scalars(
            select(ApiToken).where(ApiToken.token_hash == h, ApiToken.revoked_at.is_(None))
        ).first()
        if row is None or "read" not in _scopes(row.scopes):
            return None
        has = _scopes(row.scopes)
        scopes = ["read"] + (["run"] if allow_run and "run" in has else [])
        at = now()
        row.last_used_at = at
        secret = PREFIX + secrets.token_urlsafe(32)
        made = WebSession(
            secret_hash=digest(secret),
            token_id=row.id,
            scopes=",".join(sorted(scopes, key=SCOPES.index)),
            csrf_token=secrets.token_urlsafe(32),
            created_at=at,
            expires_at=at + timedelta(seconds=max_age_s),
        )
        s.execute(delete(WebSession).where(WebSession.expires_at < at))
        s.add(made)
        s.flush()
        return NewSession(
            secret,
            BrowserSession(
                made.id, row.id, frozenset(scopes), made.csrf_token, _aware(made.expires_at)
            ),
        )


def revoke_session(factory: sessionmaker[Session], secret: str) -> bool:
    """End the session of this secret (signing out); False when there was none to end."""
    with transaction(factory) as s:
        ended = s.scalars(
            update(WebSession)
            .where(WebSession.secret_hash == digest(secret), WebSession.revoked_at.is_(None))
            .values(revoked_at=now())
            .returning(WebSession.id)
        ).all()
    return bool(ended)


class SessionChecker:
    """Looks sessions up by the secret's hash, with a short cache (as TokenChecker) so that
    the live page's pollers do not hit the database on every request. A sign-out in this
    process takes effect at once; elsewhere, and a revoked token, within CACHE_S seconds."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory
        self._cache: dict[str, tuple[float, BrowserSession | None]] = {}
        self._lock = threading.Lock()

    def cached(self, secret: str) -> tuple[bool, BrowserSession | None]:
        """(known, session) from the cache alone: known False means ask `lookup`."""
        if not secret.startswith(PREFIX) or len(secret) > 200:
            return True, None
        with self._lock:
            hit = self._cache.get(digest(secret))
        if hit is not None and time.monotonic() - hit[0] < CACHE_S:
            session = hit[1]
            if session is not None and session.expires_at <= now():
                return True, None
            return True, session
        return False, None

    def lookup(self, secret: str) -> BrowserSession | None:
        known, session = self.cached(secret)
        if known:
            return session
        h = digest(secret)
        t = time.monotonic()
        with transaction(self.factory) as s:
            found = s.execute(
                select(WebSession, ApiToken.scopes)
                .join(ApiToken, ApiToken.id == WebSession.token_id)
                .where(
                    WebSession.secret_hash == h,
                    WebSession.revoked_at.is_(None),
                    ApiToken.revoked_at.is_(None),
                )
            ).first()
        session = None
        if found is not None:
            row, token_scopes = found
            expires = _aware(row.expires_at)
            if expires > now():
                # never more than the token has now, whatever the row says
                scopes = _scopes(row.scopes) & _scopes(token_scopes) & set(BROWSER_SCOPES)
                session = BrowserSession(row.id, row.token_id, scopes, row.csrf_token, expires)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[h] = (t, session)
        return session

    def create(self, token: str, *, allow_run: bool, max_age_s: float) -> NewSession | None:
        return create_session(self.factory, token, allow_run=allow_run, max_age_s=max_age_s)

    def revoke(self, secret: str) -> bool:
        ended = revoke_session(self.factory, secret)
        with self._lock:
            self._cache.pop(digest(secret), None)
        return ended
