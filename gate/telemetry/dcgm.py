"""GPUs of Kubernetes engines read from NVIDIA's DCGM exporter (its Prometheus text at
`GATE_DCGM_URL`, an operator's setting), parsed with prometheus-client's parser.

The series and units are the exporter's defaults (NVIDIA/dcgm-exporter etc/default-counters.csv):
`DCGM_FI_DEV_FB_USED` and `DCGM_FI_DEV_FB_FREE` (gauges, MiB), `DCGM_FI_DEV_POWER_USAGE`
(gauge, W), `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (counter, mJ since boot),
`DCGM_FI_DEV_GPU_UTIL` (gauge, %), `DCGM_FI_DEV_XID_ERRORS` (gauge: the value of the last XID
error, 0 before any). Each series names its GPU with the labels of the exporter's template
(internal/pkg/rendermetrics/render_metrics.go line 47: `gpu` the host's index, `UUID`,
`pci_bus_id`, `device`, `modelName`, then the host as `Hostname` up to 4.x or `hostname` since
commit d5e5f51 "Rename Hostname label to hostname (#655)", then labels such as
`DCGM_FI_DRIVER_VERSION` and the pod's `container`, `namespace`, `pod`
(internal/pkg/transformation/const.go)); the XID series carries `err_code` and `err_msg`
(internal/pkg/collector/gpu_collector.go lines 324-331). Values are printed `%d` for integer
fields and `%f` for doubles (gpu_collector.go `toString`).

The reserved GPUs are (node, index) pairs from the placement; a series is theirs when its
`gpu` is the index and its host label the node: the exporter's host label is $NODE_NAME where
set, as the GPU operator's DaemonSet sets it to the node's name, else the pod's host name
(internal/pkg/hostname/hostname.go lines 53-56). An exporter that names no host serves one
node and is matched by index. The URL may hold `{node}` (an exporter per node, reached by the
node's name: a hostPort DaemonSet): it is then read once per node.

An XID is counted when the last-XID gauge changes to a non-zero value between two reads; the
value at the first read is the baseline (an XID from before the gate is not the candidate's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gate.core.errors import TelemetryError
from gate.telemetry.gpu import MIB, GpuReading

FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
SERIES = (FB_USED, FB_FREE, POWER_USAGE, TOTAL_ENERGY, GPU_UTIL, XID_ERRORS)
HOST_LABELS = ("hostname", "Hostname")
TIMEOUT_S = 5.0


@dataclass
class _Gpu:
    """One GPU's series gathered from one scrape."""

    labels: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)


def _host(labels: dict[str, str]) -> str | None:
    return next((labels[k] for k in HOST_LABELS if k in labels), None)


def parse_exposition(text: str) -> dict[tuple[str | None, int], _Gpu]:
    """Every GPU's default series in one scrape, keyed by (host label, gpu index)."""
    gpus: dict[tuple[str | None, int], _Gpu] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise TelemetryError(f"DCGM exporter: not Prometheus text ({exc})") from exc
    for family in families:
        # The parser names a counter's samples NAME_total even where the text says NAME
        # (prometheus_client/parser.py 0.26, lines 294-299): the family keeps the exporter's.
        if family.name not in SERIES:
            continue
        for s in family.samples:
            if s.name not in (family.name, family.name + "_total") or "gpu" not in s.labels:
                continue
            try:
                index = int(s.labels["gpu"])
            except ValueError as exc:
                raise TelemetryError(
                    f"DCGM exporter: {family.name} has gpu label {s.labels['gpu']!r}, not an index"
                ) from exc
            gpu = gpus.setdefault((_host(s.labels), index), _Gpu())
            gpu.labels.update(s.labels)
            gpu.values[family.name] = float(s.value)
    return gpus


def reading(index: int, gpu: _Gpu, xids: tuple[int, ...] = ()) -> GpuReading:
    v, labels = gpu.values, gpu.labels
    used, free = v.get(FB_USED), v.get(FB_FREE)
    energy = v.get(TOTAL_ENERGY)
    return GpuReading(
        index=index,
        uuid=labels.get("UUID") or labels.get("uuid"),
        name=labels.get("modelName"),
        driver=labels.get("DCGM_FI_DRIVER_VERSION"),
        host=_host(labels),
        memory_used_bytes=used * MIB if used is not None else None,
        memory_total_bytes=(used + free) * MIB if used is not None and free is not None else None,
        power_w=v.get(POWER_USAGE),
        energy_j=energy / 1000.0 if energy is not None else None,
        utilization_pct=v.get(GPU_UTIL),
        xids=xids,
    )


def select(
    scraped: dict[tuple[str | None, int], _Gpu], node: str, indices: Sequence[int]
) -> dict[int, _Gpu]:
    """The reserved GPUs of `node` in one scrape: matched by host label and index, or by
    index alone where the exporter names no host."""
    out: dict[int, _Gpu] = {}
    for i in indices:
        gpu = scraped.get((node, i)) or scraped.get((None, i))
        if gpu is not None:
            out[i] = gpu
    return out


@dataclass
class DcgmSource:
    """The reserved GPUs, (node, [indices]) per worker, read from the exporter at `url`."""

    url: str
    workers: Sequence[tuple[str, Sequence[int]]]
    name: str = "dcgm-exporter"
    timeout_s: float = TIMEOUT_S
    _last_xid: dict[tuple[str, int], float] = field(default_factory=dict)

    def _scrape(self, url: str) -> str:
        try:
            r = httpx.get(url, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise TelemetryError(f"DCGM exporter at {url}: {exc}") from exc
        if r.status_code != 200:
            raise TelemetryError(f"DCGM exporter at {url} answered HTTP {r.status_code}")
        return r.text

    def _xids(self, node: str, index: int, gpu: _Gpu) -> tuple[int, ...]:
        value = gpu.values.get(XID_ERRORS)
        if value is None:
            return ()
        key = (node, index)
        before = self._last_xid.get(key)
        self._last_xid[key] = value
        return (int(value),) if before is not None and value != before and value else ()

    def read(self) -> Sequence[GpuReading]:
        out: list[GpuReading] = []
        shared: dict[tuple[str | None, int], _Gpu] | None = None
        for node, indices in self.workers:
            if "{node}" in self.url:
                scraped = parse_exposition(self._scrape(self.url.replace("{node}", node)))
            else:
                if shared is None:
                    shared = parse_exposition(self._scrape(self.url))
                scraped = shared
            for index, gpu in select(scraped, node, indices).items():
                out.append(reading(index, gpu, self._xids(node, index, gpu)))
        return out

    def close(self) -> None:
        return None
