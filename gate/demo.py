"""The built-in demo: two sim engines launched as processes on reserved GPUs.

The candidate is the same sim with a slower prefill, a regression in time to first token that
the gate must catch; `clean` gives it the reference's exact settings, and the gate must let it
continue.
"""

from __future__ import annotations

from typing import Any

from gate.spec import GateSpec, parse_spec

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
REFERENCE_TTFT_MS = 40
REGRESSED_TTFT_MS = 60  # 1.5x: large enough to see in the report, small enough to be realistic


def demo_spec_dict(
    *, clean: bool = False, requests: int = 800, rate: float = 40.0
) -> dict[str, Any]:
    cand_ttft = REFERENCE_TTFT_MS if clean else REGRESSED_TTFT_MS
    return {
        "name": "demo-clean" if clean else "demo-ttft-regression",
        "model": "demo-model",
        "reference": {
            "command": [
                *SIM,
                "--ttft-ms",
                str(REFERENCE_TTFT_MS),
                "--seed",
                "1",
                "--tag",
                "demo-reference",
            ],
        },
        "candidate": {
            "command": [
                *SIM,
                "--ttft-ms",
                str(cand_ttft),
                "--seed",
                "2",
                "--tag",
                "demo-candidate",
            ],
        },
        "shape": {"sku": "H200", "gpus_per_engine": 1},
        "scenarios": [
            {
                "name": "steady",
                "api": "completions",
                "arrival": "poisson",
                "rate": rate,
                "requests": requests,
                "prompt_tokens": 128,
                "max_tokens": 32,
            }
        ],
    }


def demo_spec(*, clean: bool = False) -> GateSpec:
    return parse_spec(demo_spec_dict(clean=clean), "built-in demo spec")
