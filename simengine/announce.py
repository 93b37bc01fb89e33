"""The one line a sim prints on stdout once its port is open.

With ``--port 0`` the kernel picks the port, so whoever started the process learns it from
this line. Stdlib only, so launchers can import it without pulling in numpy.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

LISTENING_PREFIX = "sim: listening on "


class Listening(NamedTuple):
    url: str
    host: str
    port: int


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def format_listening_line(host: str, port: int) -> str:
    return LISTENING_PREFIX + base_url(host, port)


def parse_listening_line(line: str) -> Listening | None:
    """The announced address, or None if ``line`` is not the announcement."""
    line = line.strip()
    if not line.startswith(LISTENING_PREFIX):
        return None
    url = line[len(LISTENING_PREFIX) :]
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return None
    return Listening(url, parts.hostname, parts.port)
