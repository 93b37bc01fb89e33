"""How long an engine step takes, and the latency floor of a request's first token.

Kept apart from the scheduler (which decides what runs) and the engine loop (which keeps the
clock), so the cost model can be read, tested and tuned on its own.

A step's duration follows a roofline: a forward pass is bound either by reading memory or by
arithmetic, whichever takes longer, plus per-sequence CPU work that overlaps neither:

    memory  = itl_ms + step_us_per_kv_token * kv_tokens     weights, then every context's KV
    compute = prefill_us_per_token * tokens                  2 FLOP per parameter per token
    step    = max(memory, compute) + itl_per_running_ms * (seqs - 1)

``tokens`` counts every token the step computes (one per decoding sequence plus the prompt
chunks being prefilled). So decoding is memory-bound and costs ``itl_ms`` until the batch is
large, a short prompt prefilled alongside the decodes hides under the weight read, and a long
one stretches the step (and the ITL of everything in it), as chunked prefill does on a GPU.
The step is multiplied by a lognormal jitter (median 1, drawn once per step: every sequence in
the batch sees the same slow step, as on a GPU) and a degradation factor that grows linearly
with time since the engine became ready (``--degrade-itl-per-min``).

``--degrade-ttft-per-min`` is the same creep for time to first token alone: a request arriving
t minutes after ready has its TTFT multiplied by ``1 + PCT/100 * t`` (the engine holds its
first token back by the difference and shifts its later tokens alike, as with the floor below,
so ITL is unchanged).

``--ttft-ms`` is a floor on a request's first token, ``ttft_ms + prefill_us_per_token *
prompt_tokens`` (jittered) after it arrived. While the batch is fast enough the floor decides
time to first token, which keeps a light-load TTFT as set, free of the noise of waiting for a
step boundary; under overload the queue decides it and the floor no longer matters. Every
later token of the request is shifted by the same amount, so the floor never changes
inter-token latency. It stands for per-request latency outside the GPU batch (API server,
tokenisation, scheduling hops); profiles of real hardware set it to 0 and use ``frontend_ms``,
a plain delay before the request reaches the scheduler, instead.

In a disaggregated engine (``--role prefill|decode``) the floor belongs to the prefill
worker, which answers once its first token is out; the decode worker waits ``kv_transfer_ms
+ kv_transfer_us_per_token * prompt_tokens`` for the prompt's KV instead, then decodes with no
floor: the client's TTFT is the prefill's, the transfer and one decode step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

_NS_PER_MS = 1_000_000
_NS_PER_US = 1_000
_NS_PER_MIN = 60_000_000_000


@dataclass(frozen=True, slots=True)
class CostModel:
    """Every figure of the timing model; see the module docstring for the formula."""

    itl_ms: float = 12.0
    itl_per_running_ms: float = 0.05
    step_us_per_kv_token: float = 0.0
    prefill_us_per_token: float = 50.0
    ttft_ms: float = 40.0
    frontend_ms: float = 0.0
    jitter: float = 0.03
    degrade_itl_per_min: float = 0.0
    degrade_ttft_per_min: float = 0.0
    # A decode worker's wait for a remote prefill's KV (--role decode): not a step, no jitter.
    kv_transfer_ms: float = 0.0
    kv_transfer_us_per_token: float = 0.0


class StepTimer:
    """Step durations in integer nanoseconds, so deadlines add up exactly on the clock.

    Jitter comes from one RNG seeded by ``--seed``: the sequence of draws is reproducible,
    though which step or request gets which draw depends on arrival timing.
    """

    def __init__(self, cost: CostModel, seed: int = 0, *, origin_ns: int = 0) -> None:
        self.cost = cost
        self._base_ns = cost.itl_ms * _NS_PER_MS
        self._per_seq_ns = cost.itl_per_running_ms * _NS_PER_MS
        self._per_kv_ns = cost.step_us_per_kv_token * _NS_PER_US
        self._per_prefill_ns = cost.prefill_us_per_token * _NS_PER_US
        self._floor_ns = cost.ttft_ms * _NS_PER_MS
        self._degrade = cost.degrade_itl_per_min / 100.0
        self._degrade_ttft = cost.degrade_ttft_per_min / 100.0
        self._sigma = cost.jitter
        self._rng = random.Random(seed)
        self.origin_ns = origin_ns

    def _jitter(self) -> float:
        if self._sigma <= 0.0:
            return 1.0
        return math.exp(self._rng.gauss(0.0, self._sigma))

    def degradation(self, at_ns: int) -> float:
        """Slow-down factor at ``at_ns``: 1 + PCT/100 per minute since ``origin_ns``."""
        if self._degrade <= 0.0:
            return 1.0
        return 1.0 + self._degrade * max(0, at_ns - self.origin_ns) / _NS_PER_MIN

    def ttft_degradation(self, at_ns: int) -> float:
        """TTFT multiplier of a request arriving at ``at_ns`` (``--degrade-ttft-per-min``):
        1 + PCT/100 per minute since ``origin_ns``."""
        if self._degrade_ttft <= 0.0:
            return 1.0
        return 1.0 + self._degrade_ttft * max(0, at_ns - self.origin_ns) / _NS_PER_MIN

    def step_ns(self, num_seqs: int, num_tokens: int, kv_tokens: int, at_ns: int) -> int:
        memory = self._base_ns + self._per_kv_ns * kv_tokens
        compute = self._per_prefill_ns * num_tokens
        base = max(memory, compute) + self._per_seq_ns * max(0, num_seqs - 1)
        return max(0, round(base * self._jitter() * self.degradation(at_ns)))

    def first_token_floor_ns(self, prompt_tokens: int) -> int:
        """Earliest first token after arrival; 0 when ``--ttft-ms`` is 0 (no floor)."""
        if self._floor_ns <= 0.0:
            return 0
        base = self._floor_ns + self._per_prefill_ns * prompt_tokens
        return round(base * self._jitter())

    def frontend_ns(self) -> int:
        return round(self.cost.frontend_ms * _NS_PER_MS)

    def kv_transfer_ns(self, prompt_tokens: int) -> int:
        """How long a decode worker waits for the KV of a prompt prefilled elsewhere."""
        cost = self.cost
        return round(
            cost.kv_transfer_ms * _NS_PER_MS
            + cost.kv_transfer_us_per_token * _NS_PER_US * prompt_tokens
        )
