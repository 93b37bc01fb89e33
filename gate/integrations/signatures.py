"""Webhook signatures: HMAC-SHA256 over the raw body, GitHub's header format
(`X-Hub-Signature-256: sha256=<hex>`), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Hub-Signature-256"
PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    return PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True only for a well-formed header whose digest matches; the comparison takes the same
    time wherever the first differing byte is."""
    if not header or not header.startswith(PREFIX) or len(header) != len(PREFIX) + 64:
        return False
    expected = sign(secret, body)
    return hmac.compare_digest(expected.encode(), header.encode())
