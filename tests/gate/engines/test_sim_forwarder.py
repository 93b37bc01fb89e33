"""The sim's old entry points: specs written before it became `simengine` start
``python -m gate.engines.sim`` and ``python -m gate.engines.sim.router``; both still serve,
with the same flags, and say once on stderr where the sim lives now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from simengine.launch import SimPool

ROOT = Path(__file__).resolve().parents[3]
FAST = ("--load-s", "0", "--warmup-s", "0", "--ttft-ms", "5", "--itl-ms", "1", "--jitter", "0")


def _help(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )


def test_the_old_module_paths_take_the_same_flags() -> None:
    for old, new in (
        ("gate.engines.sim", "simengine"),
        ("gate.engines.sim.router", "simengine.router"),
    ):
        forwarded, direct = _help(old), _help(new)
        assert forwarded.stdout == direct.stdout
        assert f"`python -m {old}` is deprecated: run `python -m {new}`" in forwarded.stderr
        assert "deprecated" not in direct.stderr


def test_the_old_module_paths_still_serve(tmp_path: Path) -> None:
    with SimPool(workdir=tmp_path, cwd=ROOT) as pool:
        whole = pool.start(*FAST, module="gate.engines.sim")
        prefill = pool.start(*FAST, "--role", "prefill", module="gate.engines.sim")
        decode = pool.start(*FAST, "--role", "decode", module="gate.engines.sim")
        router = pool.start(
            "--prefill", prefill.url, "--decode", decode.url, module="gate.engines.sim.router"
        )
        body = {"model": "sim-model", "prompt": "hello", "max_tokens": 4, "temperature": 0}
        texts = []
        for url in (whole.url, router.url):
            model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
            answer = httpx.post(f"{url}/v1/completions", json={**body, "model": model}, timeout=10)
            assert answer.status_code == 200, answer.text
            texts.append(answer.json()["choices"][0]["text"])
        assert texts[0] == texts[1]  # the disaggregated sim answers as a whole one
        assert "is deprecated: run `python -m simengine`" in whole.stderr()
