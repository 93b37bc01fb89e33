"""An engine's Prometheus endpoint as a telemetry `Source`: one bounded GET per tick, parsed
with `prometheus-client`'s text parser (`text_string_to_metric_families`, the reference
implementation of the format) and mapped to the gate's vocabulary (vocabulary.py).

Bounded: the body is read as a stream and the scrape fails past `max_bytes` (a real vLLM's
answer is 54 kB: tests/support/captures/vllm/vllm-metrics.http), within `timeout_s`; a failed
scrape raises `TelemetryError`, which the sampler records as a gap. The client is its own
(sync httpx on the sampler's thread), never the load's: a slow scrape cannot delay a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gate.core.errors import TelemetryError
from gate.telemetry.source import Sample
from gate.telemetry.vocabulary import map_families, wanted_lines

__all__ = ["PrometheusSource", "parse_metrics"]

DEFAULT_MAX_BYTES = 1 << 20


def parse_metrics(text: str) -> list[Sample]:
    """Prometheus' text format -> the vocabulary's samples (TelemetryError when unparsable):
    the lines the vocabulary reads (`wanted_lines`), through prometheus-client's parser."""
    try:
        flat = [
            (s.name, s.labels, float(s.value))
            for family in text_string_to_metric_families(wanted_lines(text))
            for s in family.samples
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise TelemetryError(f"not Prometheus' text format: {exc}") from None
    return map_families(flat)


@dataclass
class PrometheusSource:
    """GET `url` each tick; `name` says which engine and path it reads."""

    name: str
    url: str
    timeout_s: float = 2.0
    max_bytes: int = DEFAULT_MAX_BYTES
    _client: httpx.Client | None = field(default=None, init=False, repr=False)

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s, trust_env=False)
        return self._client

    def read(self) -> Sequence[Sample]:
        try:
            with self._http().stream("GET", self.url) as resp:
                if resp.status_code != 200:
                    raise TelemetryError(f"{self.url} answered HTTP {resp.status_code}")
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise TelemetryError(f"{self.url} answered over {self.max_bytes} bytes")
        except httpx.HTTPError as exc:
            raise TelemetryError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        return parse_metrics(body.decode("utf-8", errors="replace"))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
