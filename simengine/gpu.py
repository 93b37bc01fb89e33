"""The sim's simulated GPUs: what a real engine's GPUs would show, written where the test
stand-ins for `nvidia-smi` and the DCGM exporter read it (tests/support/gpu_standins.py).

A sim process holds the GPUs named by CUDA_VISIBLE_DEVICES (what the gate gives an engine,
gate/engines/launchers.py) and, when a state directory is given (`--gpu-state-dir`, or the
environment's SIMENGINE_GPU_STATE_DIR), writes one JSON file per GPU index there every
WRITE_EVERY_S, replaced atomically:

    memory     --gpu-memory-gib, the engine's footprint, split evenly over its GPUs (an engine
               that reserves its KV cache up front, as vLLM does, holds it from the start)
    power      --gpu-idle-w per GPU plus --gpu-j-per-token x the tokens generated per second
               (averaged over the last second, as NVML's power reading is on Ampere and newer)
    energy     the integral of that power since the process started (mJ, NVML's unit)
    XID        `--gpu-xid CODE:AT_S`: the driver reports XID CODE that many seconds after ready

so that a candidate flagged with a larger footprint or more joules per token is what a gate
with the stand-ins on PATH sees, end to end. Without CUDA_VISIBLE_DEVICES or a state directory
it writes nothing. The GPU is named after the H100 of the nvidia-smi capture the stand-in's
format comes from (tests/support/captures/nvidia-smi/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

STATE_DIR_ENV = "SIMENGINE_GPU_STATE_DIR"
WRITE_EVERY_S = 0.1
POWER_WINDOW_S = 1.0
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_TOTAL_MIB = 81559
DRIVER = "590.48.01"


def visible_indices(env: dict[str, str] | os._Environ[str] = os.environ) -> list[int]:
    text = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def parse_xid(text: str) -> tuple[int, float]:
    """``"79:3"`` -> (79, 3.0): XID 79, three seconds after ready."""
    code, sep, at = text.partition(":")
    try:
        value = (int(code), float(at))
    except ValueError:
        raise ValueError(f"not CODE:AT_S: {text!r}") from None
    if not sep or value[0] <= 0 or value[1] < 0:
        raise ValueError(f"not CODE:AT_S with CODE > 0 and AT_S >= 0: {text!r}")
    return value


class SimGpus:
    """The GPUs of one sim process and the file it keeps for each."""

    def __init__(
        self,
        state_dir: Path,
        indices: list[int],
        memory_gib: float,
        idle_w: float,
        j_per_token: float,
        xids: tuple[tuple[int, float], ...],
    ) -> None:
        self.state_dir, self.indices = state_dir, indices
        self.memory_gib, self.idle_w, self.j_per_token = memory_gib, idle_w, j_per_token
        self.xids = xids
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self.energy_j = 0.0  # over all the process's GPUs
        self._last = (self.started, 0)
        self._window: deque[tuple[float, int]] = deque()

    def _power_w(self, now: float, tokens: int) -> float:
        """Every GPU's draw together: idle plus joules per token at the last second's rate."""
        self._window.append((now, tokens))
        while len(self._window) > 1 and now - self._window[0][0] > POWER_WINDOW_S:
            self._window.popleft()
        t0, k0 = self._window[0]
        rate = (tokens - k0) / (now - t0) if now > t0 else 0.0
        return self.idle_w * len(self.indices) + self.j_per_token * rate

    def write(self, tokens: int, running: int) -> None:
        now = time.monotonic()
        last_t, last_k = self._last
        self.energy_j += self.idle_w * len(self.indices) * (now - last_t)
        self.energy_j += self.j_per_token * (tokens - last_k)
        self._last = (now, tokens)
        power = self._power_w(now, tokens)
        since_ready = now - self.ready_at if self.ready_at is not None else -1.0
        xids = [code for code, at in self.xids if since_ready >= at]
        n = len(self.indices)
        for index in self.indices:
            state = {
                "index": index,
                "uuid": f"GPU-5a1e0000-0000-4000-8000-{index:012d}",
                "name": GPU_NAME,
                "driver_version": DRIVER,
                "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
                "memory_total_mib": GPU_MEMORY_TOTAL_MIB,
                "memory_used_mib": round(self.memory_gib * 1024 / n),
                "power_w": round(power / n, 2),
                "energy_mj": int(self.energy_j * 1000 / n),
                "utilization_pct": 100 if running else 0,
                "xids": xids,
            }
            path = self.state_dir / f"{index}.json"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, path)

    async def run(self, read: Callable[[], tuple[int, int]]) -> None:
        """Write every WRITE_EVERY_S until cancelled; `read` gives (tokens so far, running)."""
        while True:
            # A state directory gone at teardown: the stand-ins read nothing more.
            with contextlib.suppress(OSError):
                self.write(*read())
            await asyncio.sleep(WRITE_EVERY_S)


def sim_gpus(
    state_dir: str | None,
    memory_gib: float,
    idle_w: float,
    j_per_token: float,
    xids: tuple[tuple[int, float], ...],
) -> SimGpus | None:
    """The process's GPUs, or None where it has none or nowhere to say so."""
    where = state_dir or os.environ.get(STATE_DIR_ENV)
    indices = visible_indices()
    if not where or not indices:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return SimGpus(path, indices, memory_gib, idle_w, j_per_token, xids)
