"""A spec's verdict alerts (`notify`): which targets hear how the gate ended.

An entry names an operator's target (`target`: GATE_ALERT_TARGETS, whose URL the spec never
sees) or a URL of its own (`url`), which the service calls only when it is on the operator's
allow-list (GATE_ALERT_ALLOW, checked when the gate is created and again when the alert is
sent) and never at a metadata or link-local address (gate/access/network.py). The spec only
checks the shape here; the allow-list is the service's (gate/service/admission.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gate.access.network import UrlRefused, check_always, check_syntax
from gate.spec.fields import MAX_URL_CHARS, StrictModel

MAX_NOTIFY = 8


class NotifySpec(StrictModel):
    target: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$",
        description="an operator's alert target by name (GATE_ALERT_TARGETS)",
    )
    url: str | None = Field(
        default=None,
        max_length=MAX_URL_CHARS,
        description="an incoming webhook URL; called only when on GATE_ALERT_ALLOW",
    )
    format: Literal["slack", "json"] = Field(
        default="json",
        description="slack: Slack's incoming-webhook message (text and blocks); json: the "
        "verdict summary as JSON. A named target's own format wins.",
    )
    on: Literal["hold", "all"] = Field(
        default="hold", description="which verdicts alert: only holds (default), or every one"
    )

    @model_validator(mode="after")
    def _one_of(self) -> NotifySpec:
        if (self.target is None) == (self.url is None):
            raise ValueError("give exactly one of `target` (an operator's) or `url`")
        if self.url is not None:
            try:
                check_always(check_syntax(self.url), resolve=None)
            except UrlRefused as exc:
                raise ValueError(f"url: {exc.message}") from None
        return self
