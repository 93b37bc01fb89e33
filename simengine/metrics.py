"""What the sim serves at /metrics: vLLM's families, then the sim's own counters, as one table.

The ``vllm:`` families carry vLLM's names, types and help texts, so a client that scrapes vLLM
(the gate's saturation and preemption checks) scrapes the sim the same way; the ``sim:``
counters say what the sim did on purpose (faults, shed and slow requests, its connection
habits) for the tests that need to know. A family is data (`Family`): adding one is a row, and
the text format is written in one place (`render`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from simengine.config import SimConfig
from simengine.engine import SimEngine
from simengine.faults import FaultCounters
from simengine.http11 import ConnectionStats

FINISH_REASONS = ("stop", "length", "abort")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Scraped(Protocol):
    """What /metrics reads of the app (`simengine.app.SimApp`), read only."""

    @property
    def config(self) -> SimConfig: ...
    @property
    def engine(self) -> SimEngine: ...
    @property
    def started_generations(self) -> int: ...
    @property
    def injected_errors(self) -> int: ...
    @property
    def shed_requests(self) -> int: ...
    @property
    def slow_requests(self) -> int: ...
    @property
    def kv_handoffs(self) -> int: ...
    @property
    def kv_transfers(self) -> int: ...
    @property
    def stream_faults(self) -> FaultCounters: ...
    @property
    def connections(self) -> ConnectionStats: ...


# A family's samples: (its own labels, rendered, or "" for none; the value).
Samples = Callable[[Scraped], Sequence[tuple[str, float]]]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    samples: Samples


def _one(read: Callable[[Scraped], float]) -> Samples:
    """A family of one sample with only the model's label."""
    return lambda app: (("", read(app)),)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _cache_config(app: Scraped) -> Sequence[tuple[str, float]]:
    """vLLM's cache_config_info: the KV cache's configuration as labels of a gauge of 1
    (vllm/v1/metrics/loggers.py line 1120 in the test bed's vLLM; a few of its labels). An
    unlimited cache (--kv-cache-tokens 0) states no size, as "None", as vLLM writes unset ones."""
    c = app.config
    tokens = c.kv_cache_tokens
    blocks = str(tokens // c.block_size) if tokens > 0 else "None"
    size = str(tokens) if tokens > 0 else "None"
    labels = (
        f'block_size="{c.block_size}",cache_dtype="auto",enable_prefix_caching="False",'
        f'kv_cache_size_tokens="{size}",num_gpu_blocks="{blocks}"'
    )
    return ((labels, 1.0),)


VLLM: tuple[Family, ...] = (
    Family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        _one(lambda app: app.engine.running),
    ),
    Family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        _one(lambda app: app.engine.waiting),
    ),
    Family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        _one(lambda app: app.engine.scheduler.kv_usage),
    ),
    Family(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        _one(lambda app: app.engine.scheduler.num_preemptions),
    ),
    Family(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        _cache_config,
    ),
    Family(
        "vllm:request_success_total",
        "counter",
        "Count of finished requests by finish reason.",
        lambda app: [
            (f'finished_reason="{reason}"', app.engine.stats.finished[reason])
            for reason in FINISH_REASONS
        ],
    ),
    Family(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        _one(lambda app: app.engine.stats.prompt_tokens),
    ),
    Family(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        _one(lambda app: app.engine.stats.generation_tokens),
    ),
)

SIM: tuple[Family, ...] = (
    Family(
        "sim:generation_requests_total",
        "counter",
        "Generation requests accepted by the sim.",
        _one(lambda app: app.started_generations),
    ),
    Family(
        "sim:injected_errors_total",
        "counter",
        "Requests failed on purpose by --error-rate.",
        _one(lambda app: app.injected_errors),
    ),
    Family(
        "sim:shed_requests_total",
        "counter",
        "Requests refused by --max-waiting.",
        _one(lambda app: app.shed_requests),
    ),
    Family(
        "sim:slow_requests_total",
        "counter",
        "Generation requests whose TTFT was multiplied by --slow-factor (--slow-share).",
        _one(lambda app: app.slow_requests),
    ),
    Family(
        "sim:stream_errors_total",
        "counter",
        "Streams ended by an error event (--stream-error-rate).",
        _one(lambda app: app.stream_faults.stream_errors),
    ),
    Family(
        "sim:hung_streams_total",
        "counter",
        "Streams silenced by --hang-after-tokens.",
        _one(lambda app: app.stream_faults.hung_streams),
    ),
    Family(
        "sim:engine_steps_total",
        "counter",
        "Engine steps run.",
        _one(lambda app: app.engine.stats.steps),
    ),
    Family(
        "sim:connections_opened_total",
        "counter",
        "Client connections accepted.",
        _one(lambda app: app.connections.opened),
    ),
    Family(
        "sim:connections_closed_total",
        "counter",
        "Connections the server closed, by habit "
        "(--keep-alive-timeout, --max-requests-per-connection).",
        lambda app: [
            ('reason="idle"', app.connections.closed_idle),
            ('reason="limit"', app.connections.closed_at_limit),
        ],
    ),
    Family(
        "sim:requests_dropped_total",
        "counter",
        "Requests closed unanswered: their connection had served its limit, silently.",
        _one(lambda app: app.connections.dropped),
    ),
)

# Only a worker of a disaggregated engine (--role prefill or decode) serves these.
WORKER: tuple[Family, ...] = (
    Family(
        "sim:kv_handoffs_total",
        "counter",
        "Prefills whose KV this worker handed on to a decode worker (--role prefill).",
        _one(lambda app: app.kv_handoffs),
    ),
    Family(
        "sim:kv_transfers_total",
        "counter",
        "Requests decoded from a prefill worker's KV (--role decode).",
        _one(lambda app: app.kv_transfers),
    ),
)


def families(app: Scraped) -> tuple[Family, ...]:
    return VLLM + SIM + (WORKER if app.config.role != "both" else ())


def render(app: Scraped) -> bytes:
    """Prometheus' text format: HELP, TYPE, then every sample with the model's label last."""
    model = f'model_name="{_label(app.config.model)}"'
    lines: list[str] = []
    for family in families(app):
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        lines += [
            f"{family.name}{{{own + ',' if own else ''}{model}}} {float(value)}"
            for own, value in family.samples(app)
        ]
    return ("\n".join(lines) + "\n").encode()
