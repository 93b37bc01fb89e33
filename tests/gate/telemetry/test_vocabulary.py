"""Each engine family's names mapped to the gate's vocabulary (gate/telemetry/vocabulary.py).

vLLM: the real endpoint's bytes (tests/support/captures/vllm/vllm-metrics.http, vLLM 0.32 CPU).
SGLang, TensorRT-LLM, llama.cpp: the text format their servers write, with the names read in
their source: SGLang python/sglang/srt/metrics/collector.py @00ae9c1 (SchedulerMetricsCollector:
sglang:num_running_reqs, num_queue_reqs, token_usage, cache_hit_rate, max_total_num_tokens,
spec_accept_rate, num_retracted_requests_total); TensorRT-LLM tensorrt_llm/metrics/collector.py
@050f80d lines 59-97 (trtllm_ names; Dynamo re-exports them as trtllm:); llama.cpp
tools/server/README.md "GET /metrics" (llamacpp:requests_processing, requests_deferred,
kv_cache_usage_ratio)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gate.core.errors import TelemetryError
from gate.telemetry import parse_metrics
from gate.telemetry.vocabulary import family_of

CAPTURE = Path(__file__).parents[2] / "support" / "captures" / "vllm" / "vllm-metrics.http"


def as_dict(text: str) -> tuple[dict[str, float], dict[str, str]]:
    series, config = {}, {}
    for s in parse_metrics(text):
        if s.text is not None:
            config[s.metric] = s.text
        else:
            series[s.metric] = s.value
    return series, config


def test_the_real_vllm_endpoint() -> None:
    body = CAPTURE.read_text().split("\n\n", 1)[1]
    series, config = as_dict(body)
    assert series == {
        "requests_running": 0.0,
        "requests_waiting": 0.0,
        "kv_cache_usage": 0.0,
        "preemptions_total": 0.0,
        "prefix_cache_queries_total": 62.0,
        "prefix_cache_hits_total": 0.0,
    }
    assert config == {
        "kv_cache_blocks": "8192",
        "block_size": "128",
        "kv_cache_tokens": "1048576",
        "kv_cache_memory_bytes": "1073741824",
        "cache_dtype": "auto",
        "prefix_caching": "True",
    }
    assert family_of(["vllm:num_requests_running"]) == "vllm"


SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
sglang:token_usage{model_name="m",tp_rank="1"} 0.7
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.25
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 161721.0
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m"} 0.6
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m"} 4.0
"""

TRTLLM = """\
# HELP trtllm_num_requests_running Number of active requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="m",engine_type="trtllm"} 6.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="m",engine_type="trtllm"} 1.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="m",engine_type="trtllm"} 0.4
# TYPE trtllm_kv_cache_reused_blocks counter
trtllm_kv_cache_reused_blocks_total{model_name="m",engine_type="trtllm"} 30.0
# TYPE trtllm_kv_cache_missed_blocks counter
trtllm_kv_cache_missed_blocks_total{model_name="m",engine_type="trtllm"} 70.0
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{model_name="m",engine_type="trtllm"} 4096.0
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{model_name="m",engine_type="trtllm"} 32.0
# TYPE trtllm_spec_decode_num_draft_tokens counter
trtllm_spec_decode_num_draft_tokens_total{model_name="m",engine_type="trtllm"} 200.0
# TYPE trtllm_spec_decode_num_accepted_tokens counter
trtllm_spec_decode_num_accepted_tokens_total{model_name="m",engine_type="trtllm"} 150.0
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 512
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def test_sglang_names_combine_over_ranks() -> None:
    series, config = as_dict(SGLANG)
    assert series == {
        "requests_running": 5.0,  # summed over tensor-parallel ranks
        "requests_waiting": 7.0,
        "kv_cache_usage": pytest.approx(0.6),  # a share: averaged
        "prefix_cache_hit_rate": 0.25,
        "spec_decode_acceptance_rate": 0.6,
        "preemptions_total": 4.0,
    }
    assert config == {"kv_cache_tokens": "161721"}
    assert family_of(n for n in ("python_gc", "sglang:token_usage")) == "sglang"


def test_tensorrt_llm_blocks_make_tokens_and_queries() -> None:
    series, config = as_dict(TRTLLM)
    assert series["prefix_cache_queries_total"] == 100.0
    assert series["prefix_cache_hits_total"] == 30.0
    assert series["spec_decode_accepted_tokens_total"] == 150.0
    assert config == {"kv_cache_blocks": "4096", "block_size": "32", "kv_cache_tokens": "131072"}
    # Dynamo's spelling reads the same
    dynamo, _ = as_dict(TRTLLM.replace("trtllm_", "trtllm:"))
    assert dynamo == series


def test_llamacpp_has_no_capacity_and_no_preemptions() -> None:
    series, config = as_dict(LLAMACPP)
    assert series == {"requests_running": 2.0, "requests_waiting": 3.0, "kv_cache_usage": 0.125}
    assert config == {}  # kv_cache_tokens is the tokens in use, not the capacity


def test_unset_labels_and_garbage() -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None",cache_dtype="auto"} 1.0\n'
    _, config = as_dict(text)
    assert config == {"block_size": "16", "cache_dtype": "auto"}
    assert math.isnan(parse_metrics(text)[0].value)
    with pytest.raises(TelemetryError, match="Prometheus"):
        parse_metrics("vllm:num_requests_running{ 1 2 3\n")
