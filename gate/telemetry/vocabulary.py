"""Each engine family's Prometheus names mapped to one vocabulary (pure: families in, samples
out), so the checks read `requests_waiting` whichever engine answered.

Where each name comes from (read in the engines' source, not guessed):
- vLLM 0.32 (the test bed's, `vllm/v1/metrics/loggers.py`): num_requests_running (line 528),
  num_requests_waiting (538), kv_cache_usage_perc (620), prefix_cache_queries (662),
  prefix_cache_hits (673), num_preemptions (739), cache_config_info (1120, its labels carry
  num_gpu_blocks, block_size, kv_cache_size_tokens, cache_dtype, enable_prefix_caching);
  `vllm/v1/spec_decode/metrics.py` spec_decode_num_draft_tokens and
  spec_decode_num_accepted_tokens (230-231). Counters end in `_total` on the wire
  (tests/support/captures/vllm/vllm-metrics.http). The sim serves the same names
  (simengine/metrics.py).
- SGLang (`python/sglang/srt/metrics/collector.py` @00ae9c1, SchedulerMetricsCollector):
  sglang:num_running_reqs, num_queue_reqs, token_usage (the KV pool's used share),
  cache_hit_rate (the prefix cache's), max_total_num_tokens (the KV pool in tokens),
  spec_accept_rate, num_retracted_requests_total (a retraction is SGLang's preemption).
- TensorRT-LLM (`tensorrt_llm/metrics/collector.py` @050f80d, MetricsCollector's docstring,
  lines 59-97): trtllm_num_requests_running, num_requests_waiting, kv_cache_utilization,
  kv_cache_hit_rate, kv_cache_reused_blocks_total and kv_cache_missed_blocks_total (the prefix
  cache in blocks), kv_cache_max_blocks, kv_cache_tokens_per_block,
  spec_decode_num_draft_tokens_total, spec_decode_num_accepted_tokens_total. Dynamo re-exports
  them as `trtllm:` (its docs/backends/trtllm/prometheus.md); both spellings are read.
- llama.cpp (`tools/server/README.md`, "GET /metrics"): llamacpp:requests_processing,
  requests_deferred, kv_cache_usage_ratio. Its `kv_cache_tokens` is the tokens in use, not the
  capacity, so it is not mapped to one. It has no preemptions, prefix-cache counters or
  configuration metric: what it lacks is a note in the checks, never a hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

from gate.telemetry.source import Sample

__all__ = ["CONFIG_LABELS", "VOCABULARY", "family_of", "map_families"]

Combine = Literal["sum", "mean"]

VOCABULARY: dict[str, str] = {
    "requests_running": "requests in the running batch (gauge)",
    "requests_waiting": "requests queued for the batch (gauge)",
    "kv_cache_usage": "share of the KV cache in use, 0 to 1 (gauge)",
    "preemptions_total": "requests preempted (SGLang: retracted) so far (counter)",
    "prefix_cache_queries_total": "prompt tokens (TensorRT-LLM: blocks) looked up (counter)",
    "prefix_cache_hits_total": "of those, found in the prefix cache (counter)",
    "prefix_cache_hit_rate": "the engine's own prefix-cache hit rate (gauge)",
    "spec_decode_draft_tokens_total": "speculative tokens drafted (counter)",
    "spec_decode_accepted_tokens_total": "drafted tokens accepted (counter)",
    "spec_decode_acceptance_rate": "the engine's own acceptance rate (gauge)",
    # The engine's GPUs (gpu_sources.py: NVML, nvidia-smi, the DCGM exporter), summed over the
    # GPUs the gate reserved for it.
    "gpu_memory_used_bytes": "GPU memory in use, all the engine's GPUs (gauge)",
    "gpu_power_watts": "GPU power draw, all the engine's GPUs (gauge)",
    "gpu_energy_joules_total": "GPU energy counter, all the engine's GPUs (counter; NVML, DCGM)",
    "gpu_utilization_percent": "mean GPU utilisation of the engine's GPUs (gauge)",
    "gpu_xid_errors_total": "XID errors reported on the engine's GPUs this scenario (counter)",
    "gpu_xid_last": "the last XID error code reported, 0 before any (gauge)",
}
"""The gate's names for what engines report over time, each with its meaning."""

CONFIG_LABELS: dict[str, str] = {
    "kv_cache_blocks": "KV cache blocks on the accelerator",
    "block_size": "tokens per KV block",
    "kv_cache_tokens": "KV cache capacity in tokens",
    "kv_cache_memory_bytes": "bytes given to the KV cache",
    "cache_dtype": "the KV cache's data type",
    "prefix_caching": "prefix caching on (True/False)",
    "gpu_model": "the engine's GPUs, as their driver names them",
    "gpu_driver": "the GPU driver's version",
    "gpu_count": "GPUs read for the engine (its reserved ones)",
}
"""The engine's configuration as its metrics state it (kept once per timeline)."""

# Sample name on the wire -> (vocabulary name, how several label sets combine).
_SERIES: dict[str, tuple[str, Combine]] = {
    # vLLM and the sim
    "vllm:num_requests_running": ("requests_running", "sum"),
    "vllm:num_requests_waiting": ("requests_waiting", "sum"),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage", "mean"),
    "vllm:gpu_cache_usage_perc": ("kv_cache_usage", "mean"),  # vLLM before 0.10
    "vllm:num_preemptions_total": ("preemptions_total", "sum"),
    "vllm:prefix_cache_queries_total": ("prefix_cache_queries_total", "sum"),
    "vllm:prefix_cache_hits_total": ("prefix_cache_hits_total", "sum"),
    "vllm:spec_decode_num_draft_tokens_total": ("spec_decode_draft_tokens_total", "sum"),
    "vllm:spec_decode_num_accepted_tokens_total": ("spec_decode_accepted_tokens_total", "sum"),
    # SGLang
    "sglang:num_running_reqs": ("requests_running", "sum"),
    "sglang:num_queue_reqs": ("requests_waiting", "sum"),
    "sglang:token_usage": ("kv_cache_usage", "mean"),
    "sglang:cache_hit_rate": ("prefix_cache_hit_rate", "mean"),
    "sglang:spec_accept_rate": ("spec_decode_acceptance_rate", "mean"),
    "sglang:num_retracted_requests_total": ("preemptions_total", "sum"),
    # TensorRT-LLM (trtllm_ as it serves them; trtllm: as Dynamo re-exports them)
    "trtllm_num_requests_running": ("requests_running", "sum"),
    "trtllm_num_requests_waiting": ("requests_waiting", "sum"),
    "trtllm_kv_cache_utilization": ("kv_cache_usage", "mean"),
    "trtllm_kv_cache_hit_rate": ("prefix_cache_hit_rate", "mean"),
    "trtllm_kv_cache_reused_blocks_total": ("prefix_cache_hits_total", "sum"),
    "trtllm_kv_cache_missed_blocks_total": ("prefix_cache_misses_total", "sum"),
    "trtllm_spec_decode_num_draft_tokens_total": ("spec_decode_draft_tokens_total", "sum"),
    "trtllm_spec_decode_num_accepted_tokens_total": ("spec_decode_accepted_tokens_total", "sum"),
    # llama.cpp
    "llamacpp:requests_processing": ("requests_running", "sum"),
    "llamacpp:requests_deferred": ("requests_waiting", "sum"),
    "llamacpp:kv_cache_usage_ratio": ("kv_cache_usage", "mean"),
}

# Numeric gauges that state configuration rather than a changing level.
_CONFIG_GAUGES: dict[str, str] = {
    "sglang:max_total_num_tokens": "kv_cache_tokens",
    "trtllm_kv_cache_max_blocks": "kv_cache_blocks",
    "trtllm_kv_cache_tokens_per_block": "block_size",
}

# vLLM's cache_config_info labels -> configuration names.
_VLLM_CACHE_LABELS: dict[str, str] = {
    "num_gpu_blocks": "kv_cache_blocks",
    "block_size": "block_size",
    "kv_cache_size_tokens": "kv_cache_tokens",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "cache_dtype": "cache_dtype",
    "enable_prefix_caching": "prefix_caching",
}

_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "trtllm_": "trtllm", "llamacpp:": "llamacpp"}


def _wire(name: str) -> str:
    return "trtllm_" + name[len("trtllm:") :] if name.startswith("trtllm:") else name


WANTED: frozenset[str] = frozenset(
    [*_SERIES, *_CONFIG_GAUGES, "vllm:cache_config_info"]
    + [
        "trtllm:" + n[len("trtllm_") :]
        for n in (*_SERIES, *_CONFIG_GAUGES)
        if n.startswith("trtllm_")
    ]
)
"""Every sample name the tables read, in both TensorRT-LLM spellings."""


def wanted_lines(text: str) -> str:
    """Only the sample lines whose name the tables read. A real vLLM's /metrics is 54 kB, most
    of it histogram buckets the gate does not use; parsing all of it cost 10.6 ms of CPU a
    scrape against 1.6 ms with these lines only (bench/telemetry_bench.py,
    docs/performance.md). HELP and TYPE lines go too: the tables key on sample names, which
    the parser keeps as written."""
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < end:
                end = i
        if line[:end] in WANTED:
            keep.append(line)
    return "\n".join(keep) + "\n"


def family_of(names: Iterable[str]) -> str | None:
    """The engine family whose names these are (the first known prefix), or None."""
    for name in names:
        for prefix, family in _PREFIXES.items():
            if _wire(name).startswith(prefix):
                return family
    return None


def _number(text: str) -> str | None:
    """A configuration label's value, or None where the engine left it unset."""
    return None if text in ("", "None", "none", "null") else text


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def map_families(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[Sample]:
    """(wire name, labels, value) of every scraped sample -> the vocabulary's samples: series
    combined over label sets (engines of one data-parallel server: counts summed, shares
    averaged), configuration as text samples. Names outside the tables are dropped."""
    acc: dict[str, list[float]] = {}
    how: dict[str, Combine] = {}
    config: dict[str, str] = {}
    for raw, labels, value in samples:
        name = _wire(raw)
        if name == "vllm:cache_config_info":
            for label, key in _VLLM_CACHE_LABELS.items():
                got = _number(labels.get(label, ""))
                if got is not None:
                    config[key] = got
            continue
        if name in _CONFIG_GAUGES and math.isfinite(value):
            config[_CONFIG_GAUGES[name]] = _fmt(value)
            continue
        mapped = _SERIES.get(name)
        if mapped is None or not math.isfinite(value):
            continue
        acc.setdefault(mapped[0], []).append(value)
        how[mapped[0]] = mapped[1]
    values = {k: (sum(v) if how[k] == "sum" else sum(v) / len(v)) for k, v in acc.items() if v}
    if "prefix_cache_misses_total" in values:  # TensorRT-LLM counts hits and misses
        misses = values.pop("prefix_cache_misses_total")
        values["prefix_cache_queries_total"] = values.get("prefix_cache_hits_total", 0.0) + misses
    if "kv_cache_tokens" not in config and {"kv_cache_blocks", "block_size"} <= set(config):
        try:
            tokens = float(config["kv_cache_blocks"]) * float(config["block_size"])
            config["kv_cache_tokens"] = _fmt(tokens)
        except ValueError:
            pass
    out = [Sample(k, v) for k, v in sorted(values.items())]
    out += [Sample(k, math.nan, text=v) for k, v in sorted(config.items())]
    return out
