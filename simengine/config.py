"""What one sim process is: `SimConfig`, every knob of it, frozen.

Every knob is a flag (``simengine/cli.py`` parses and range-checks them into this) so that a test
or a gate run can build a reference and a candidate that differ in exactly one respect (a slower
ITL, a fault, another model seed) and nothing else. The defaults are the ``demo`` profile's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from simengine.features import DEFAULT_MAX_LOGPROBS, Feature, Served
from simengine.profiles import DEFAULT_PROFILE
from simengine.timing import CostModel

Role = Literal["both", "prefill", "decode"]
"""What one sim process is in a serving unit (README "Disaggregated prefill and decode"):
``both`` a whole engine (the default, and what every sim was before roles); ``prefill`` and
``decode`` the two worker groups of a disaggregated engine, behind ``simengine.router``."""
ROLES: tuple[Role, ...] = get_args(Role)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything that determines how one sim process behaves.

    Frozen so the server, the engine and the timing model can share one instance without
    any of them changing what the others see. The defaults are the ``demo`` profile's.
    """

    port: int
    host: str = "127.0.0.1"
    model: str = "demo-model"
    profile: str = DEFAULT_PROFILE
    max_model_len: int = 4096
    vocab_size: int = 4096
    # Startup phases: the port stays closed while "loading", then /health answers 503.
    load_s: float = 0.3
    warmup_s: float = 0.2
    # `seed` drives timing jitter, fault draws and the numeric variants; `model_seed` drives
    # the toy weights, so two engines can jitter differently yet decode identically.
    seed: int = 0
    model_seed: int = 0
    # Performance model (see timing.py and scheduler.py).
    frontend_ms: float = 0.0
    ttft_ms: float = 40.0
    prefill_us_per_token: float = 50.0
    itl_ms: float = 12.0
    itl_per_running_ms: float = 0.05
    step_us_per_kv_token: float = 0.0
    jitter: float = 0.03
    tokens_per_event: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_tokens: int = 0
    block_size: int = 16  # tokens per KV block: what vllm:cache_config_info states
    # Disaggregated prefill and decode: which half this process is, and what a decode worker
    # waits for the prompt's KV from a prefill worker (Llama 3.1 8B's 128 KiB a token over a
    # 400 Gb/s NIC at ~80%: ~3 us a token, after ~2 ms of handshake).
    role: Role = "both"
    kv_transfer_ms: float = 2.0
    kv_transfer_us_per_token: float = 3.0
    # Numeric variants of a candidate (see model.py).
    logit_noise: float = 0.0
    numeric_bug: float = 0.0
    nan_after_requests: int | None = None
    # Faults.
    crash_after_requests: int | None = None
    crash_after_s: float | None = None
    error_rate: float = 0.0
    stream_error_rate: float = 0.0
    hang_after_tokens: int | None = None
    hang_rate: float = 1.0
    hang_requests: tuple[int, ...] = ()
    degrade_itl_per_min: float = 0.0
    # Latency regressions that are not a steady shift (timing.py, engine.py).
    slow_share: float = 0.0
    slow_factor: float = 1.0
    stalls: tuple[tuple[float, float], ...] = ()
    degrade_ttft_per_min: float = 0.0
    max_waiting: int | None = None
    shed_status: int = 429
    # Connection habits of real servers (http11.ConnectionHabits): None is no limit.
    keep_alive_timeout_s: float | None = None
    max_requests_per_connection: int | None = None
    announce_keep_alive: bool = False
    # What the engine answers beyond text (features.py): vLLM's defaults, everything on.
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    without: tuple[Feature, ...] = ()
    # Simulated GPUs (gpu.py): the footprint, idle draw and joules per generated token, XID
    # errors (code, seconds after ready), and where their state is written (None: the
    # environment's SIMENGINE_GPU_STATE_DIR, or nowhere).
    gpu_memory_gib: float = 20.0
    gpu_idle_w: float = 90.0
    gpu_j_per_token: float = 0.5
    gpu_xids: tuple[tuple[int, float], ...] = ()
    gpu_state_dir: str | None = None
    # Ground truth for benchmarks of clients.
    truth_log: str | None = None
    tag: str = ""

    def cost_model(self) -> CostModel:
        return CostModel(
            itl_ms=self.itl_ms,
            itl_per_running_ms=self.itl_per_running_ms,
            step_us_per_kv_token=self.step_us_per_kv_token,
            prefill_us_per_token=self.prefill_us_per_token,
            ttft_ms=self.ttft_ms,
            frontend_ms=self.frontend_ms,
            jitter=self.jitter,
            degrade_itl_per_min=self.degrade_itl_per_min,
            degrade_ttft_per_min=self.degrade_ttft_per_min,
            kv_transfer_ms=self.kv_transfer_ms,
            kv_transfer_us_per_token=self.kv_transfer_us_per_token,
        )

    def served(self) -> Served:
        return Served.build(self.max_logprobs, self.without)
