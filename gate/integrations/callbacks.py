"""placeholder"""

from typing import Any

from gate.core.settings import Settings


def deliver_callback(callback: dict[str, Any], summary: dict[str, Any], settings: Settings) -> None:
    return None
