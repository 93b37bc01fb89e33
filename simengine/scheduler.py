"""Continuous batching: which sequences take part in the next engine step, with how many tokens.

Pure (no clock, no I/O), so the batching rules are tested without a server and the engine
loop only has to ask "what runs now?". The design follows the idea of vLLM's V1 scheduler (not
its code): every sequence needs some number of tokens (its prompt plus what it generated so
far) and has some of them computed (held in the KV cache). Each step spends a token budget
(``max_num_batched_tokens``): first on running sequences, oldest first (a decode needs one
token, a prompt being prefilled continues with its next chunk), then on admitting waiting
sequences in arrival order while there are free sequence slots (``max_num_seqs``), budget and
KV room. A prompt larger than what is left of the budget is prefilled in chunks over several
steps (chunked prefill), so one long prompt never stalls every decode behind it for long.

A sequence prefilled by another engine (``remote_kv``, a disaggregated decode worker) is
admitted with that KV already in place: it takes KV room but no budget, and computes only the
rest (the last prompt position, whose logits give its first token).

When the KV cache is full, the most recently admitted running sequence is preempted: its KV is
dropped and it returns to the front of the queue, to be recomputed (prompt plus generated
tokens) once there is room. No sequence is admitted in a step that had to preempt, as in vLLM,
so an overloaded cache does not thrash.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class SeqState:
    """Scheduling state of one request; the engine extends it with decoding state."""

    prompt_len: int
    submitted_ns: int
    # Prompt plus generated tokens: what the KV cache must hold before the next sample.
    num_tokens: int = field(init=False)
    num_computed: int = 0
    status: SeqStatus = SeqStatus.WAITING
    preemptions: int = 0
    # Prompt tokens whose KV arrived from a prefill worker (a disaggregated decode): placed in
    # the cache on admission without being computed. Once placed they are the sequence's own,
    # so a preemption recomputes them here, as vLLM's decode worker would.
    remote_kv: int = 0

    def __post_init__(self) -> None:
        self.num_tokens = self.prompt_len


S = TypeVar("S", bound=SeqState)


@dataclass(slots=True)
class StepPlan(Generic[S]):
    """One step: each scheduled sequence with the number of tokens it computes."""

    scheduled: list[tuple[S, int]]
    # Tokens computed in the step: one per decode plus every prompt chunk.
    num_tokens: int
    prefill_tokens: int
    # Tokens attended over in this step (each sequence's context after the step), summed: the
    # KV bytes a decode step reads grow with it.
    kv_tokens: int
    admitted: list[S]
    preempted: list[S]

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)


class Scheduler(Generic[S]):
    """Waiting queue, running batch and KV accounting (in tokens, not blocks)."""

    def __init__(
        self, *, max_num_seqs: int, max_num_batched_tokens: int, kv_cache_tokens: int = 0
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1 or kv_cache_tokens < 0:
            raise ValueError("scheduler limits must be positive")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_cache_tokens = kv_cache_tokens
        self._capacity: float = kv_cache_tokens if kv_cache_tokens > 0 else math.inf
        self.waiting: deque[S] = deque()
        self.running: list[S] = []
        self.kv_used = 0
        self.num_preemptions = 0

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use (0 when it is unlimited)."""
        return self.kv_used / self.kv_cache_tokens if self.kv_cache_tokens > 0 else 0.0

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def free_slots(self) -> int:
        return self.max_num_seqs - len(self.running)

    def add(self, seq: S) -> None:
        if seq.prompt_len > self._capacity:
            raise ValueError("prompt does not fit in the KV cache")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: S) -> None:
        """Take a sequence out wherever it is (finished, aborted or stopped by a fault)."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.kv_used -= seq.num_computed
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED

    def _preempt_newest(self) -> S:
        victim = self.running.pop()
        self.kv_used -= victim.num_computed
        victim.num_computed = 0
        victim.status = SeqStatus.WAITING
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self, now_ns: int) -> StepPlan[S]:
        """Plan one step starting at ``now_ns``; KV for the planned tokens is reserved at once.

        Sequences submitted after ``now_ns`` are not admitted: a step cannot include a request
        that had not arrived when it began.
        """
        budget = self.max_num_batched_tokens
        capacity = self._capacity
        scheduled: list[tuple[S, int]] = []
        preempted: list[S] = []
        admitted: list[S] = []
        prefill = kv = 0

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            while self.kv_used + n > capacity:
                victim = self._preempt_newest()
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            if not (n == 1 and seq.num_computed >= seq.prompt_len):
                prefill += n
            kv += seq.num_computed + n
            self.kv_used += n
            budget -= n
            scheduled.append((seq, n))
            i += 1

        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                seq = waiting[0]
                if seq.submitted_ns > now_ns:
                    break
                loaded = seq.remote_kv
                n = min(seq.num_tokens - seq.num_computed - loaded, budget)
                if self.kv_used + loaded + n > capacity:
                    break
                waiting.popleft()
                seq.status = SeqStatus.RUNNING
                self.running.append(seq)
                if loaded:
                    seq.remote_kv = 0
                    seq.num_computed += loaded
                    self.kv_used += loaded
                prefill += n
                kv += seq.num_computed + n
                self.kv_used += n
                budget -= n
                scheduled.append((seq, n))
                admitted.append(seq)
        tokens = self.max_num_batched_tokens - budget
        return StepPlan(scheduled, tokens, prefill, kv, admitted, preempted)

    @staticmethod
    def complete(plan: StepPlan[S]) -> list[S]:
        """Apply a step's computation; returns the sequences that sample a token in it.

        A sequence samples when its whole context is computed (the last prefill chunk, or a
        decode); the sampled token becomes one more token to compute next step.
        """
        sampled: list[S] = []
        for seq, n in plan.scheduled:
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                seq.num_tokens += 1
                sampled.append(seq)
        return sampled
