"""Launch presets for real engines: the argv each one needs, and its known quirks.

A preset turns `{preset: vllm, binary: /opt/vllm-0.11/bin/vllm, args: [...]}` into an argv
template with the gate's placeholders, so a reference and a candidate can differ only by
binary, interpreter (virtual environment) or image. Every preset is readied the same way (port
open, `/health` 200, the model listed in `/v1/models`); the quirks below are why each preset
passes the flags it passes.

Quirks, per preset:

- vllm (`vllm serve MODEL`): `/health` is 200 only once the engine core is up; the served name
  defaults to the weights path, so `--served-model-name` pins it to the spec's model;
  request logging is off by default since 0.11, which removed `--disable-log-requests`
  (passing it there ends the engine before its port opens), so the preset passes neither it
  nor `--enable-log-requests`.
- sglang (`python -m sglang.launch_server`): the id in `/v1/models` is the model path unless
  `--served-model-name` is given; old releases answer `/health` before the first forward pass
  (the gate's warm-up requests cover that).
- trtllm (`trtllm-serve MODEL`): tensor parallelism is `--tp_size`; an engine build or a
  checkpoint conversion can take many minutes on first start (raise `readiness_timeout_s`).
- sim (`python -m gate.engines.sim`): our simulated engine, the test and demo default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PresetName = Literal["vllm", "sglang", "trtllm", "sim"]


@dataclass(frozen=True, slots=True)
class Preset:
    name: PresetName
    program: str  # default program; `binary` (or `python` for module launches) replaces it
    module: str | None  # launched as `python -m module` when set
    args: tuple[str, ...]

    def argv(
        self, *, binary: str | None, python: str | None, extra: tuple[str, ...] = ()
    ) -> list[str]:
        if self.module is not None:
            head = [python or binary or "python", "-m", self.module]
        else:
            head = [binary or self.program]
        return [*head, *self.args, *extra]


PRESETS: dict[str, Preset] = {
    "vllm": Preset(
        "vllm",
        "vllm",
        None,
        (
            "serve",
            "{model}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--served-model-name",
            "{model}",
            "--tensor-parallel-size",
            "{tp}",
        ),
    ),
    "sglang": Preset(
        "sglang",
        "python",
        "sglang.launch_server",
        (
            "--model-path",
            "{model}",
            "--served-model-name",
            "{model}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--tp",
            "{tp}",
        ),
    ),
    "trtllm": Preset(
        "trtllm",
        "trtllm-serve",
        None,
        ("{model}", "--host", "{host}", "--port", "{port}", "--tp_size", "{tp}"),
    ),
    "sim": Preset(
        "sim",
        "python",
        "gate.engines.sim",
        ("--host", "{host}", "--port", "{port}", "--model", "{model}"),
    ),
}


def preset_argv(
    name: str, *, binary: str | None = None, python: str | None = None, args: tuple[str, ...] = ()
) -> list[str]:
    return PRESETS[name].argv(binary=binary, python=python, extra=args)
