"""Named sets of performance figures (``--profile``); any flag overrides any one of them.

The figures are estimates from public hardware numbers and vLLM's defaults, not measurements:
they make the sim behave like the engine it stands for in shape (where it saturates, how TTFT
and ITL grow with load) and roughly in scale. Measure the real engine to calibrate a profile.

Hardware numbers used: H200 SXM, 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16. Llama 3.1
8B: 8.0 B parameters (16.1 GB in bf16), 32 layers, 8 KV heads of 128, so 128 KiB of bf16 KV per
token. Llama 3.1 70B: 70.6 B parameters (141 GB), 80 layers, 8 KV heads of 128, 320 KiB of KV
per token (80 KiB per GPU at TP4).

Steps follow a roofline (see timing.py): ``max(memory, compute) + per-sequence CPU``.

* ``itl_ms`` (the memory time of a step, the decode step at batch 1): weights read once per
  step. 8B: 16.1 GB / 4.8 TB/s = 3.4 ms at the bandwidth limit, ~4.4 ms at the ~75% that decode
  kernels reach, plus ~0.6 ms of launch overhead with CUDA graphs: 5 ms. 70B TP4: 35.3 GB per
  GPU, 9.8 ms at 75%, plus two all-reduces per layer (~160 x 8 us): 11 ms.
* ``step_us_per_kv_token``: attention reads every context token's KV each step. 8B: 128 KiB /
  (4.8 TB/s x 75%) = 0.036 us; 70B TP4: 80 KiB per GPU, 0.022 us.
* ``prefill_us_per_token`` (compute per token, prompt or decode): 2 FLOP per parameter. 8B:
  16 GFLOP / (989 TFLOP/s x 55% MFU) = 30 us. 70B TP4: 141 GFLOP / (4 x 989 TFLOP/s x 50%) =
  71 us, plus activation all-reduces: 80 us. Decode turns compute-bound above itl_ms /
  prefill_us_per_token tokens a step (~170 for 8B, ~140 for 70B), the usual roofline ridge.
* ``itl_per_running_ms``: the engine's CPU work per sequence and step (scheduling, sampling,
  detokenising), which the GPU does not hide: ~8 us.
* ``max_num_seqs`` 1024 and ``max_num_batched_tokens`` 8192: vLLM's defaults for the OpenAI
  server on GPUs with at least 70 GiB (``EngineArgs.get_batch_defaults``).
* ``kv_cache_tokens``: vLLM reports ~543k tokens for Llama 3.1 8B on a 94 GB H100 NVL at
  ``gpu_memory_utilization`` 0.9; scaled to 141 GB: (127 GB - 16 GB weights - ~3 GB
  activations) / 128 KiB = ~830k. 70B TP4: (127 - 35 - 4) GB per GPU / 80 KiB = ~1.08M.
* ``frontend_ms``: HTTP parsing, tokenisation and the hop to the engine core process, ~1.5 ms.
* ``load_s``/``warmup_s``: weight loading from a local disk (including interpreter and
  library start-up) and torch.compile from a warm cache plus CUDA graph capture. Cold starts
  without the compile cache take longer.

``demo`` (the default) is not hardware: it is the gate demo's engine, with a 40 ms TTFT floor
and 12 ms steps, slow enough to see in a report and fast enough for a test. ``tiny`` is for
tests that need batching and queueing to show up within a second.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class Profile:
    """The flags a profile sets; every field has a flag of the same name."""

    description: str
    load_s: float
    warmup_s: float
    frontend_ms: float
    ttft_ms: float
    itl_ms: float
    itl_per_running_ms: float
    step_us_per_kv_token: float
    prefill_us_per_token: float
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    max_model_len: int
    jitter: float


PROFILES: dict[str, Profile] = {
    "demo": Profile(
        description="the gate demo's engine: 40 ms TTFT floor, 12 ms decode steps",
        load_s=0.3,
        warmup_s=0.2,
        frontend_ms=0.0,
        ttft_ms=40.0,
        itl_ms=12.0,
        itl_per_running_ms=0.05,
        step_us_per_kv_token=0.0,
        prefill_us_per_token=50.0,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        kv_cache_tokens=0,
        max_model_len=4096,
        jitter=0.03,
    ),
    "tiny": Profile(
        description="fast tests: 2 ms steps, 64 sequences, no startup delay, no jitter",
        load_s=0.0,
        warmup_s=0.0,
        frontend_ms=0.0,
        ttft_ms=0.0,
        itl_ms=2.0,
        itl_per_running_ms=0.01,
        step_us_per_kv_token=0.0,
        prefill_us_per_token=2.0,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        kv_cache_tokens=0,
        max_model_len=4096,
        jitter=0.0,
    ),
    "llama-3.1-8b-h200": Profile(
        description="Llama 3.1 8B in bf16 on one H200 (vLLM V1 defaults)",
        load_s=25.0,
        warmup_s=20.0,
        frontend_ms=1.5,
        ttft_ms=0.0,
        itl_ms=5.0,
        itl_per_running_ms=0.008,
        step_us_per_kv_token=0.036,
        prefill_us_per_token=30.0,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_cache_tokens=830_000,
        max_model_len=131_072,
        jitter=0.02,
    ),
    "llama-3.1-70b-h200x4": Profile(
        description="Llama 3.1 70B in bf16 on four H200s, tensor parallel 4",
        load_s=75.0,
        warmup_s=45.0,
        frontend_ms=1.5,
        ttft_ms=0.0,
        itl_ms=11.0,
        itl_per_running_ms=0.008,
        step_us_per_kv_token=0.022,
        prefill_us_per_token=80.0,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_cache_tokens=1_080_000,
        max_model_len=131_072,
        jitter=0.02,
    ),
}

DEFAULT_PROFILE = "demo"
PROFILE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Profile) if f.name != "description")
