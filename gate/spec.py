"""The gate spec: what to compare, on which GPU shape, under which load, judged by which policy.

Specs are written by people, so loading one reports every mistake at once, each with the path of
the field (``scenarios[0].rate``) and what is wrong with it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gate.analysis.policy import Policy
from gate.core.errors import FieldProblem, SpecError, UrlRefused
from gate.core.vocabulary import Role
from gate.reservations.allocator import LEVELS, ConnectRule, GroupRequest, Level, ShapeRequest
from gate.reservations.shapes import GROUP_ROLE_MESSAGE, GROUP_ROLE_RE, group_problems

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
PLACEHOLDERS = ("port", "model", "gpus", "tp", "host")
# In the argv of a worker group or a router (an engine with `groups`): the group's own name and
# GPUs, and the address of any group of the same engine (`{url:decode}`, `{host:prefill}`,
# `{port:prefill}`): every port is picked before the first process starts.
GROUP_PLACEHOLDERS = ("role", "group_gpus")
GROUP_REF_RE = re.compile(r"^(url|host|port):([a-z0-9-]{1,16})$")
MAX_SPEC_BYTES = 1_000_000
# Every string a spec holds is stored with its gate and shown back: three gates whose URLs had
# 300,000-character paths once made every gate list and the `/` page 1.8 MB. A URL or an image
# is shown in every gate list (the engines' labels, 500 characters in the database); any other
# string (an argv item, an env value, a region, a key) is at most MAX_SPEC_STRING.
MAX_SPEC_STRING = 4_096
MAX_URL_CHARS = 500
MAX_LIST_ITEMS = 256  # regions, providers, pools, tolerations, pull secrets: names, not data


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting alphanumeric")
    return v


Name = Annotated[str, AfterValidator(_check_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=MAX_SPEC_STRING)


_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# distribution/reference's grammar: [registry[:port]/]path[:tag][@algorithm:hex]
IMAGE_RE = re.compile(
    rf"^(?:(?P<registry>{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?)/)?"
    rf"(?P<path>{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY_RE = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
KUBERNETES_PLACEHOLDERS = ("port", "host", "model", "tp", "gpus", "nodes", "total_gpus")
DNS_LABEL_MESSAGE = (
    "must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and "
    "ending with a letter or digit"
)


def image_repository(image: str) -> str:
    """`registry/path` of an image reference, without its tag or digest."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def check_image(v: str) -> str:
    """An image reference a kubelet can pull, pinned by a tag or a digest."""
    m = IMAGE_RE.fullmatch(v) if len(v) <= 512 and v.isprintable() else None
    if not m or len(v.split("@")[0].rsplit(":", 1)[0]) > 255:
        raise ValueError(
            "not an image reference; use [registry/]repository:tag or @sha256:<digest>, "
            "e.g. vllm/vllm-openai:v0.11.0"
        )
    if m.group("tag") is None and m.group("digest") is None:
        raise ValueError(
            "give a tag or a digest (e.g. vllm/vllm-openai:v0.11.0): without one the image is "
            ":latest, which can change between the gate and the rollout"
        )
    return v


class SecretKeyRef(_Strict):
    """One key of a Secret in the engine's namespace, e.g. a Hugging Face token."""

    secret: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)

    @field_validator("secret")
    @classmethod
    def _secret_ok(cls, v: str) -> str:
        if not DNS_SUBDOMAIN_RE.match(v):
            raise ValueError("must be a Secret name (lower-case DNS subdomain)")
        return v


# A placeholder's shape: `{name}` or `{url:GROUP}`; other braces (a JSON argument such as
# vLLM's --kv-transfer-config) are left as written.
_ANY_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?::[^{}\s\"':]*)?)\}")


def _kubernetes_argv_problem(v: list[str] | None) -> str | None:
    """The first unknown placeholder of a kubernetes argv; group placeholders ({role},
    {group_gpus}, {url:GROUP}...) pass here and are checked against the engine's groups."""
    for item in v or []:
        for name in _ANY_PLACEHOLDER_RE.findall(item):
            if name in KUBERNETES_PLACEHOLDERS or name in GROUP_PLACEHOLDERS:
                continue
            if GROUP_REF_RE.match(name):
                continue
            return (
                f"unknown placeholder {{{name}}}; use one of "
                + ", ".join("{" + p + "}" for p in KUBERNETES_PLACEHOLDERS)
                + " (in a group or router: also {role}, {group_gpus}, {url:GROUP}, "
                "{host:GROUP}, {port:GROUP})"
            )
    return None


def _argv_shell_problem(argv: list[str], what: str) -> str | None:
    from gate.engines.manifests import check_argv

    try:
        check_argv(tuple(argv), what)
    except ValueError as exc:
        return str(exc).removeprefix("argv: ")
    return None


class KubernetesGroupSpec(_Strict):
    """One worker group of a kubernetes engine with `groups`: a Pod (one node) or a
    LeaderWorkerSet (several) on the group's reserved nodes, running the engine's image with
    this argv (default: the engine's `command`/`args`) and the engine's env plus this `env`."""

    command: list[str] | None = Field(default=None, description="default: the engine's")
    args: list[str] | None = Field(
        default=None,
        description="default: the engine's; also {role}, {group_gpus}, {url:GROUP}, "
        "{host:GROUP}, {port:GROUP} are filled in",
    )
    worker_command: list[str] | None = None
    worker_args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict, description="added to the engine's env")

    @field_validator("command", "args", "worker_command", "worker_args")
    @classmethod
    def _argv_ok(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        problem = _kubernetes_argv_problem(v)
        if problem is None and v and info.field_name in ("command", "worker_command"):
            problem = _argv_shell_problem(v, "argv")
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return v


class KubernetesRouterSpec(_Strict):
    """The router of a kubernetes engine with `groups`: a Pod without GPUs on the first
    group's leader node, behind the engine's Service; the gate loads it."""

    image: str | None = Field(default=None, description="default: the engine's image")
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(
        default_factory=list,
        description="e.g. [--prefill, '{url:prefill}', --decode, '{url:decode}']",
    )
    env: dict[str, str] = Field(default_factory=dict, description="the router's environment")
    port: int = Field(default=8000, ge=1, le=65535)
    health_path: str = Field(default="/health", pattern=r"^/\S*$")

    @field_validator("image")
    @classmethod
    def _image_ok(cls, v: str | None) -> str | None:
        return v if v is None else check_image(v)

    @field_validator("command", "args")
    @classmethod
    def _argv_ok(cls, v: list[str], info: ValidationInfo) -> list[str]:
        problem = _kubernetes_argv_problem(v)
        if problem is None and v and info.field_name == "command":
            problem = _argv_shell_problem(v, "argv")
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return v

    @model_validator(mode="after")
    def _argv_given(self) -> KubernetesRouterSpec:
        if not self.command and not self.args:
            raise ValueError("give the router's `command` and/or `args`")
        problem = _argv_shell_problem([*self.command, *self.args], "command/args")
        if problem is not None:
            raise ValueError(problem)
        return self


class KubernetesSpec(_Strict):
    """An engine run as pods by the gate (`gate/engines/kubernetes.py`): a bare Pod when the
    shape is one node per engine, a LeaderWorkerSet (plus a ComputeDomain inside an NVLink
    clique) when it is several, and a Service, all owned by the gate's Lease. The reserved
    shape decides the GPUs, the nodes and the clique; this says what runs there."""

    image: str = Field(
        max_length=MAX_URL_CHARS, description="the engine's image, pinned by a tag or a digest"
    )
    namespace: str = Field(description="namespace of the engine's objects and the gate's Lease")
    command: list[str] = Field(
        default_factory=list, description="replaces the image's entrypoint (an argv list)"
    )
    args: list[str] = Field(
        default_factory=list,
        description="the entrypoint's arguments; {port}, {host}, {model}, {tp} (GPUs per node), "
        "{gpus}, {nodes}, {total_gpus} are filled in; $(VAR) is expanded by Kubernetes",
    )
    worker_command: list[str] | None = Field(
        default=None, description="multi-node engines: the workers' command (default: command)"
    )
    worker_args: list[str] | None = Field(
        default=None, description="multi-node engines: the workers' args (default: args)"
    )
    port: int = Field(default=8000, ge=1, le=65535, description="the port the engine serves")
    health_path: str = Field(default="/health", pattern=r"^/\S*$")
    env: dict[str, str] = Field(default_factory=dict, description="the container's environment")
    secret_env: dict[str, SecretKeyRef] = Field(
        default_factory=dict, description="environment variables read from Secrets"
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)"
    )
    context: str | None = Field(default=None, description="kubeconfig context (default: current)")
    in_cluster: bool = Field(
        default=False, description="use the service account of the pod the gate runs in"
    )
    cluster: str | None = Field(
        default=None,
        max_length=100,
        description="the cluster's name in GPU reservations (default: the kubeconfig context's "
        "cluster, or `in-cluster`); gates on one cluster must agree on it",
    )
    cpu: str | None = Field(default=None, description="CPU request, e.g. 32")
    memory: str | None = Field(default=None, description="memory request and limit, e.g. 512Gi")
    shm_size: str | None = Field(default="16Gi", description="/dev/shm size (NCCL needs room)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    service_account: str | None = None
    tolerate: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu"], description="taint keys the pods tolerate"
    )
    groups: dict[str, KubernetesGroupSpec] | None = Field(
        default=None,
        description="an engine of several worker groups (the shape's `groups`): per group "
        "role, the argv (and env) that group runs instead of the engine's; with a `router`",
    )
    router: KubernetesRouterSpec | None = Field(
        default=None, description="with `groups`: the engine's entry point, a Pod without GPUs"
    )

    @field_validator("image")
    @classmethod
    def _image_ok(cls, v: str) -> str:
        return check_image(v)

    @field_validator("namespace")
    @classmethod
    def _namespace_ok(cls, v: str) -> str:
        if not DNS_LABEL_RE.match(v):
            raise ValueError(DNS_LABEL_MESSAGE)
        return v

    @field_validator("command", "args", "worker_command", "worker_args")
    @classmethod
    def _argv_items_ok(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        # Group placeholders pass here; `_consistent` refuses them without `groups`.
        problem = _kubernetes_argv_problem(v)
        if problem is None and v and info.field_name in ("command", "worker_command"):
            problem = _argv_shell_problem(v, "argv")
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names_ok(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return v

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity_ok(cls, v: str | None) -> str | None:
        if v is not None and not QUANTITY_RE.match(v):
            raise ValueError("not a Kubernetes quantity, e.g. 32, 500m, 512Gi")
        return v

    @field_validator("image_pull_secrets", "service_account")
    @classmethod
    def _names_ok(cls, v: list[str] | str | None) -> list[str] | str | None:
        for name in [v] if isinstance(v, str) else v or []:
            if not DNS_SUBDOMAIN_RE.match(name) or len(name) > 253:
                raise ValueError(f"{name!r} is not an object name (lower-case DNS subdomain)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> KubernetesSpec:
        from gate.engines.manifests import check_argv

        if self.router is not None and self.groups is None:
            raise ValueError("`router` goes with `groups`")
        if self.groups is None:
            argv = [
                *self.command,
                *self.args,
                *(self.worker_command or []),
                *(self.worker_args or []),
            ]
            used = [
                n
                for item in argv
                for n in _ANY_PLACEHOLDER_RE.findall(item)
                if n in GROUP_PLACEHOLDERS or GROUP_REF_RE.match(n)
            ]
            if used:
                raise ValueError(f"{{{used[0]}}} is for the argv of a worker group or router")
        if not self.command and not self.args and self.groups is None:
            raise ValueError(
                "give `command` and/or `args`: the image's entrypoint alone does not say the "
                "model or the port"
            )
        # command and args form one argv: `command: [sh], args: [-c, ...]` is a shell string too.
        check_argv((*self.command, *self.args), "command/args")
        workers = (*(self.worker_command or self.command), *(self.worker_args or self.args))
        check_argv(workers, "worker_command/worker_args")
        if self.in_cluster and (self.kubeconfig or self.context):
            raise ValueError("give `kubeconfig`/`context` or `in_cluster: true`, not both")
        return self

    @property
    def access(self) -> tuple[str | None, str | None, bool]:
        """How the gate reaches the cluster; both engines of a gate must share it."""
        return (self.kubeconfig, self.context, self.in_cluster)


class EngineSpec(_Strict):
    """An engine to launch (`command`, an argv list, or a `preset`), one run as pods on a
    cluster (`kubernetes`), or one already running (`url`)."""

    command: list[str] | None = Field(
        default=None,
        description="argv of the engine; {port}, {host}, {model}, {gpus}, {tp} are filled in.",
    )
    preset: Literal["vllm", "sglang", "trtllm", "sim"] | None = Field(
        default=None, description="a known engine: the gate builds its argv (see presets.py)"
    )
    binary: str | None = Field(
        default=None, description="with a preset: the engine's program, e.g. a venv's vllm"
    )
    python: str | None = Field(
        default=None,
        description="with a module preset (sglang, sim), or vllm launched as a module: "
        "the interpreter to use (a virtualenv's python)",
    )
    args: list[str] = Field(default_factory=list, description="with a preset: extra arguments")
    url: str | None = Field(
        default=None, max_length=MAX_URL_CHARS, description="Base URL of a running engine."
    )
    kubernetes: KubernetesSpec | None = Field(
        default=None, description="run the engine as pods on the nodes the gate reserves"
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    cwd: str | None = Field(default=None, description="Working directory of the process.")
    readiness_timeout_s: float = Field(default=300.0, gt=0, le=7200)
    caller_url: bool = Field(
        default=False,
        description="set by the service when a request named this `url`: the engine checks "
        "it against GATE_ENGINE_URL_ALLOW again when it attaches (a request cannot set it)",
    )
    groups: dict[str, EngineSpec] | None = Field(
        default=None,
        description="an engine of several worker groups (the shape's `groups`): one process "
        "(`command` or `preset`) per group role, e.g. {prefill: {preset: sim, args: [--role, "
        "prefill]}, decode: {...}}, with a `router` in front",
    )
    router: EngineSpec | None = Field(
        default=None,
        description="with `groups`: the engine's entry point (`command` or `preset`), given "
        "the groups' addresses as {url:GROUP}, {host:GROUP}, {port:GROUP}",
    )

    @field_validator("command")
    @classmethod
    def _command_ok(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must not be empty: give the program and its arguments as a list")
        if not v[0].strip():
            raise ValueError("the program name (first item) is empty")
        for item in v:
            for name in re.findall(r"\{([^{}]*)\}", item):
                if name not in PLACEHOLDERS + GROUP_PLACEHOLDERS and not GROUP_REF_RE.match(name):
                    raise ValueError(
                        f"unknown placeholder {{{name}}}; use one of "
                        + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                        + " (in a group or router: also {role}, {group_gpus}, {url:GROUP}, "
                        "{host:GROUP}, {port:GROUP})"
                    )
        return v

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from gate.access.network import check_always, check_syntax

        try:
            clean = check_syntax(v)
            check_always(clean, resolve=None)  # names resolve when the engine attaches
        except UrlRefused as exc:
            raise ValueError(str(exc)) from None
        return clean

    @model_validator(mode="after")
    def _one_kind(self) -> EngineSpec:
        given = [k for k in ENGINE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(ENGINE_KIND_MESSAGE)
        if self.preset is None and (self.binary or self.python or self.args):
            raise ValueError("`binary`, `python` and `args` go with a `preset`")
        if self.caller_url and self.url is None:
            raise ValueError("`caller_url` goes with a `url`")
        if self.router is not None and self.groups is None:
            raise ValueError("`router` goes with `groups`")
        if self.groups is not None:
            if self.router is None:
                raise ValueError(
                    "an engine with `groups` needs a `router`: its entry point, which the gate "
                    "loads (e.g. {preset: sim} or a `command`)"
                )
            if self.env or self.cwd:
                raise ValueError("with `groups`, `env` and `cwd` go on each group and the router")
            for name, member in [*self.groups.items(), ("router", self.router)]:
                if member.kind != "process" or member.groups is not None:
                    raise ValueError(
                        f"{name}: a group or router is a local process (`command` or "
                        "`preset`); nested groups, `url` and `kubernetes` are not supported"
                    )
        if self.kubernetes is not None and (self.env or self.cwd):
            raise ValueError(
                "`env` and `cwd` are for local processes; a kubernetes engine's environment "
                "goes in `kubernetes.env`"
            )
        return self

    @property
    def kind(self) -> Literal["process", "endpoint", "kubernetes"]:
        if self.groups is not None:
            return "process"
        if self.kubernetes is not None:
            return "kubernetes"
        return "endpoint" if self.url is not None else "process"

    @property
    def label(self) -> str:
        """What a person calls this engine in a list: its URL, preset and program, argv, or
        image."""
        if self.kubernetes is not None:
            return self.kubernetes.image
        if self.url is not None:
            return self.url
        if self.groups is not None and self.router is not None:
            parts = [f"{name}: {g.label}" for name, g in self.groups.items()]
            return "; ".join([*parts, f"router: {self.router.label}"])[:500]
        if self.preset is not None:
            parts = [self.preset, self.binary or self.python or "", *self.args]
            return " ".join(p for p in parts if p)[:500]
        return " ".join(self.command or [])[:500]

    def argv_template(self, group: str | None = None) -> list[str]:
        """The argv with placeholders; `group` names the worker group (or `router`) this spec
        is, so a preset adds that role's flags (presets.py: GROUP_FLAGS, ROUTERS)."""
        if self.command is not None:
            return list(self.command)
        from gate.engines.presets import preset_argv

        assert self.preset is not None
        return preset_argv(
            self.preset,
            binary=self.binary,
            python=self.python,
            args=tuple(self.args),
            group=group,
        )


def _placeholders(spec: EngineSpec) -> set[str]:
    return {
        n for item in [*(spec.command or []), *spec.args] for n in re.findall(r"\{([^{}]*)\}", item)
    }


def engine_group_problems(role: str, es: EngineSpec, shape_groups: list[str]) -> list[FieldProblem]:
    """An engine's groups against the shape's: one engine group per shape group and no other,
    `{url:GROUP}` naming a group of the engine, group placeholders only where groups are; for a
    launched engine (`url` engines run wherever they run)."""
    if es.kubernetes is not None:
        return kubernetes_group_problems(role, es.kubernetes, shape_groups)
    out: list[FieldProblem] = []
    if es.groups is None:
        used = sorted(
            n for n in _placeholders(es) if n in GROUP_PLACEHOLDERS or GROUP_REF_RE.match(n)
        )
        if used:
            out.append(
                FieldProblem(role, f"{{{used[0]}}} is for the argv of a worker group or router")
            )
        if shape_groups and es.kind == "process":
            out.append(
                FieldProblem(
                    f"{role}.groups",
                    "the shape has worker groups (" + ", ".join(shape_groups) + "): give the "
                    "engine one `groups` entry per group and a `router`",
                )
            )
        return out
    if not shape_groups:
        out.append(
            FieldProblem(f"{role}.groups", "the shape has no `groups`: add shape.groups for them")
        )
        return out
    for name in es.groups:
        if name not in shape_groups:
            out.append(
                FieldProblem(
                    f"{role}.groups.{name}",
                    "not a group of the shape (its groups: " + ", ".join(shape_groups) + ")",
                )
            )
    for name in shape_groups:
        if name not in es.groups:
            out.append(FieldProblem(f"{role}.groups.{name}", "missing: the shape has this group"))
    members = [*es.groups.items(), ("router", es.router)]
    for name, member in members:
        if member is None:
            continue
        for ph in sorted(_placeholders(member)):
            m = GROUP_REF_RE.match(ph)
            if m and m.group(2) not in es.groups:
                out.append(
                    FieldProblem(
                        f"{role}.groups.{name}" if name != "router" else f"{role}.router",
                        f"{{{ph}}} names no group of this engine",
                    )
                )
    if es.router is not None and es.router.preset is not None:
        from gate.engines.presets import ROUTERS

        need = ROUTERS.get(es.router.preset)
        if need is None:
            out.append(FieldProblem(f"{role}.router.preset", "no router preset of this name"))
        elif set(es.groups) != {"prefill", "decode"}:
            out.append(
                FieldProblem(
                    f"{role}.router.preset",
                    "a router preset serves groups named prefill and decode; give a `command`",
                )
            )
    return out


def kubernetes_group_problems(
    role: str, k: KubernetesSpec, shape_groups: list[str]
) -> list[FieldProblem]:
    """A kubernetes engine's `groups` against the shape's, each problem naming its field
    (`candidate.kubernetes.groups.decode`): never a single-group launch on a grouped shape."""
    at = f"{role}.kubernetes"
    if k.groups is None:
        if shape_groups:
            return [
                FieldProblem(
                    f"{at}.groups",
                    "the shape has worker groups (" + ", ".join(shape_groups) + "): give "
                    "`kubernetes.groups` one entry per group and a `kubernetes.router`",
                )
            ]
        return []
    if not shape_groups:
        return [
            FieldProblem(f"{at}.groups", "the shape has no `groups`: add shape.groups for them")
        ]
    out: list[FieldProblem] = []
    for name in k.groups:
        if name not in shape_groups:
            out.append(
                FieldProblem(
                    f"{at}.groups.{name}",
                    "not a group of the shape (its groups: " + ", ".join(shape_groups) + ")",
                )
            )
    for name in shape_groups:
        if name not in k.groups:
            out.append(FieldProblem(f"{at}.groups.{name}", "missing: the shape has this group"))
        elif name == "router":
            out.append(
                FieldProblem(
                    f"{at}.groups.{name}",
                    "`router` names the engine's router (its objects are <engine>-router); "
                    "call the group something else",
                )
            )
    if k.router is None:
        out.append(
            FieldProblem(
                f"{at}.router",
                "an engine with `groups` needs a `router`: its entry point, which the gate loads",
            )
        )
    engine_argv = [*k.command, *k.args]
    members: list[tuple[str, list[str]]] = []
    for name, g in k.groups.items():
        command = k.command if g.command is None else g.command
        args = k.args if g.args is None else g.args
        if not command and not args:
            out.append(
                FieldProblem(
                    f"{at}.groups.{name}",
                    "give `command` and/or `args` here or on the engine: the image's "
                    "entrypoint alone does not say the model or the port",
                )
            )
        own = [
            *(g.command or []),
            *(g.args or []),
            *(g.worker_command or []),
            *(g.worker_args or []),
        ]
        members.append((f"{at}.groups.{name}", own))
    if k.router is not None:
        members.append((f"{at}.router", [*k.router.command, *k.router.args]))
    members.append((at, engine_argv))
    for path, argv in members:
        for item in argv:
            for ph in _ANY_PLACEHOLDER_RE.findall(item):
                m = GROUP_REF_RE.match(ph)
                if m and m.group(2) not in k.groups:
                    out.append(FieldProblem(path, f"{{{ph}}} names no group of this engine"))
    return out


ENGINE_KINDS = ("command", "preset", "url", "kubernetes", "groups")
ENGINE_KIND_MESSAGE = (
    "give exactly one of `command` (an argv to launch), `preset` (vllm, sglang, trtllm, sim), "
    "`kubernetes` (run an image as pods on the reserved nodes), `url` (attach to a running "
    "engine) or `groups` (worker groups behind a `router`)"
)
MIXED_KUBERNETES_MESSAGE = (
    "a kubernetes engine is compared with another kubernetes engine (or a `url`), not with a "
    "local process: the two would not run under the same conditions"
)
OTHER_CLUSTER_MESSAGE = (
    "both kubernetes engines must be on one cluster: give them the same `kubeconfig`, "
    "`context`, `in_cluster` and `cluster`"
)


def engine_pair_problems(data: Mapping[str, Any]) -> list[FieldProblem]:
    """Rules that tie the two engines together, checked on the raw spec."""
    engines = {r: data.get(r) for r in ("reference", "candidate")}
    kinds: dict[str, str] = {}
    for role, eng in engines.items():
        if isinstance(eng, Mapping):
            given = [k for k in ENGINE_KINDS if eng.get(k) is not None]
            if len(given) == 1:
                kinds[role] = given[0]
    problems: list[FieldProblem] = []
    if "kubernetes" in kinds.values() and {"command", "preset"} & set(kinds.values()):
        local = next(r for r, k in kinds.items() if k in ("command", "preset"))
        problems.append(FieldProblem(local, MIXED_KUBERNETES_MESSAGE))
    if list(kinds.values()).count("kubernetes") == 2:
        ref, cand = (dict(engines[r] or {}).get("kubernetes") for r in ("reference", "candidate"))
        if isinstance(ref, Mapping) and isinstance(cand, Mapping):
            keys = ("kubeconfig", "context", "cluster")
            same = all(ref.get(k) == cand.get(k) for k in keys)
            if not same or bool(ref.get("in_cluster")) != bool(cand.get("in_cluster")):
                problems.append(FieldProblem("candidate.kubernetes", OTHER_CLUSTER_MESSAGE))
    return problems


SUITES = ("normal", "peak", "overload", "recovery", "compatibility", "correctness")
LOAD_SUITES = ("normal", "peak", "overload", "recovery")
SUITE_OWN_KEYS = ("name", "suite", "api", "settings")


def suite_knob_problems(suite: str, knobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each knob the suite does not have; else for each knob nested too
    deep and each value the suite refuses by type or bound (the key names the knob, `extra.n`
    for a key of its `extra`); else for the settings taken together (`settings`)."""
    from loadgen import suite as catalogue

    known = catalogue.knobs(suite)
    out = [
        (_knob_name(k), f"not a setting of suite {suite} (its settings: {', '.join(known)})")
        for k in knobs
        if k not in known
    ]
    if out:
        return out
    limit = catalogue.MAX_SETTINGS_DEPTH - 1  # the settings themselves are the first level
    shallow: dict[str, Any] = {}
    for k, v in knobs.items():
        if catalogue.nesting_depth(v, limit) > limit:
            out.append(
                (
                    k,
                    f"nested too deep: a suite's settings are at most "
                    f"{catalogue.MAX_SETTINGS_DEPTH} levels of objects and lists, the settings "
                    "counted (settings.extra.stop is 3)",
                )
            )
        else:
            shallow[k] = v
    out += [
        (knob, f"suite {suite} rejects {knob}: {why}")
        for knob, why in catalogue.knob_problems(suite, shallow)
    ]
    if out:
        return out
    try:
        # By arithmetic: the schedule is built by the gate that runs it, not by its validation.
        catalogue.get(suite, **knobs).plan()
    except (ValueError, TypeError, ArithmeticError) as exc:
        return [("settings", f"suite {suite} rejects these settings: {exc}")]
    return []


def _knob_name(key: Any) -> str:
    """A caller's knob name as a field path shows it: at most 40 characters."""
    text = str(key)
    return text if len(text) <= 40 else text[:40] + "…"


class ScenarioSpec(_Strict):
    """One load scenario: explicit (arrival, rate, requests, ...) or a named `suite` entry
    (normal, peak, overload, recovery, compatibility, correctness) with its settings given
    as plain keys, e.g. `{suite: peak, rate: 40}`."""

    name: Name
    suite: Literal[SUITES] | None = None  # type: ignore[valid-type]
    settings: dict[str, Any] = Field(default_factory=dict, description="the suite's knobs")
    api: Literal["completions", "chat"] = "completions"
    arrival: Literal["poisson", "constant", "gamma", "concurrency"] = "poisson"
    rate: float | None = Field(default=None, gt=0, le=100_000, description="requests/s")
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    burstiness: float = Field(default=1.0, gt=0, description="gamma shape; 1 = Poisson")
    requests: int | None = Field(default=None, ge=1, le=10_000_000)
    duration_s: float | None = Field(default=None, gt=0, le=86_400)
    prompt_tokens: int = Field(default=128, ge=1, le=1_000_000)
    max_tokens: int = Field(default=32, ge=1, le=1_000_000)
    ignore_eos: bool = Field(default=True, description="fixed output lengths keep ITL comparable")
    temperature: float = Field(default=0.0, ge=0, le=2)

    @model_validator(mode="before")
    @classmethod
    def _gather_suite_knobs(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("suite") is not None:
            d = dict(data)
            d.setdefault("name", d["suite"])
            knobs = {k: d.pop(k) for k in list(d) if k not in SUITE_OWN_KEYS}
            settings = d.get("settings")
            d["settings"] = {**(settings if isinstance(settings, Mapping) else {}), **knobs}
            return d
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioSpec:
        if self.suite is not None:
            problems = suite_knob_problems(self.suite, self.settings)
        else:
            if self.settings:
                raise ValueError("`settings` belongs to a suite scenario; add `suite: NAME`")
            problems = scenario_cross_field_problems(self.model_dump())
        if problems:
            raise ValueError(problems[0][1])
        return self

    @property
    def is_probe(self) -> bool:
        return self.suite in ("compatibility", "correctness")


def scenario_cross_field_problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rules that tie fields together, checked on the raw mapping so they are reported alongside
    every field-level mistake instead of being hidden behind them."""
    out: list[tuple[str, str]] = []
    arrival = raw.get("arrival", "poisson")
    has = {k: raw.get(k) is not None for k in ("rate", "concurrency", "requests", "duration_s")}
    if arrival == "concurrency":
        if not has["concurrency"]:
            out.append(("concurrency", "required when arrival is concurrency"))
        if has["rate"]:
            out.append(("rate", "not used with arrival concurrency; remove it"))
    elif arrival in ("poisson", "constant", "gamma"):
        if not has["rate"]:
            out.append(("rate", f"required when arrival is {arrival} (requests/s)"))
        if has["concurrency"]:
            out.append(("concurrency", "only used with arrival: concurrency"))
    if has["requests"] == has["duration_s"]:
        out.append(("requests", "give exactly one of `requests` or `duration_s`"))
    return out


class GroupSpec(_Strict):
    """One worker group of each engine (e.g. prefill, decode): `gpus` on `nodes` distinct nodes,
    the same number on each, inside one domain of `level`."""

    role: str = Field(
        description="the group's name: 1-16 lower-case letters, digits or '-' (it becomes "
        "{role} in argv and part of Kubernetes names)"
    )
    gpus: int = Field(ge=1, le=4096, description="GPUs of this group in one engine")
    nodes: int = Field(default=1, ge=1, le=512, description="distinct nodes they are spread on")
    level: Level = Field(default="host", description="the level whose one domain holds the group")
    sku: str | None = Field(default=None, description="GPU product; default: the shape's")
    min_gpu_memory_gib: float | None = Field(default=None, gt=0, description="default: the shape's")

    @field_validator("role")
    @classmethod
    def _role_ok(cls, v: str) -> str:
        if not GROUP_ROLE_RE.match(v):
            raise ValueError(GROUP_ROLE_MESSAGE)
        return v


class ConnectSpec(_Strict):
    """The named groups of one engine lie inside one domain of `level` (a clique for NVLink
    between prefill and decode, a block for RDMA)."""

    groups: list[str] = Field(description="two or more group roles")
    level: Level


SINGLE_GROUP_FIELDS = ("gpus_per_engine", "nodes_per_engine", "engine_level")


def shape_problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rules over a shape's groups, checked on the raw mapping so each names its field
    (`groups[1].nodes`, `connect[0].groups`) beside every other mistake."""
    groups = raw.get("groups")
    out: list[tuple[str, str]] = []
    if groups:
        out += [
            (k, "not used with `groups`: each group gives its own gpus, nodes and level")
            for k in SINGLE_GROUP_FIELDS
            if k in raw
        ]
    return out + group_problems(groups, raw.get("connect"), raw.get("together"))


class ShapeSpec(_Strict):
    """The GPU shape each engine gets; both engines get the same shape, on disjoint GPUs.

    One group (`gpus_per_engine` on `nodes_per_engine` nodes in one `engine_level` domain), or
    several worker groups that serve as one engine (`groups`, e.g. prefill and decode) with
    `connect` rules between them; every group of both engines is placed, or none."""

    sku: str | None = Field(default=None, description="GPU product, e.g. H200; any when unset")
    min_gpu_memory_gib: float | None = Field(default=None, gt=0)
    gpus_per_engine: int = Field(default=1, ge=1, le=4096)
    nodes_per_engine: int = Field(default=1, ge=1, le=512)
    engine_level: Level = Field(
        default="host", description="the topology level that must contain each whole engine"
    )
    together: Level | None = Field(
        default=None,
        description="the level whose one domain holds both engines (default: engine_level; with "
        "`groups`, the highest level a group or connect rule names); `any` only asks for the "
        "same SKU class",
    )
    groups: list[GroupSpec] = Field(
        default_factory=list,
        description="worker groups of each engine (at most 8, roles unique); instead of "
        "gpus_per_engine, nodes_per_engine and engine_level",
    )
    connect: list[ConnectSpec] = Field(
        default_factory=list,
        description="groups of one engine that share one domain of a level, e.g. "
        "{groups: [prefill, decode], level: clique}",
    )
    regions: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="allowed regions (any if empty)",
    )
    providers: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    pools: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    headroom_gpus: int = Field(default=0, ge=0, description="GPUs to leave free in the domain")
    wait_s: float = Field(
        default=0.0, ge=0, le=86_400, description="wait this long for capacity when blocked"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ShapeSpec:
        if self.groups or self.connect:
            raw = self.model_dump(exclude_unset=True)
            raw["together"] = self.together
            if problems := shape_problems(raw):
                # The message alone: parse_spec names the field from the raw pass.
                raise ValueError(problems[0][1])
            return self
        if self.gpus_per_engine % self.nodes_per_engine:
            raise ValueError("gpus_per_engine must be a multiple of nodes_per_engine")
        if self.nodes_per_engine > 1 and self.engine_level == "host":
            raise ValueError(
                "a multi-node engine needs an engine_level above host (clique, subblock, block, "
                "cluster, region or any)"
            )
        if LEVELS.index(self.together or self.engine_level) < LEVELS.index(self.engine_level):
            raise ValueError("together must be at or above engine_level")
        return self

    def request(self, roles: tuple[str, ...]) -> ShapeRequest:
        return ShapeRequest(
            sku=self.sku,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
            gpus_per_engine=self.gpus_per_engine,
            nodes_per_engine=self.nodes_per_engine,
            engine_level=self.engine_level,
            together=self.together,
            regions=tuple(self.regions),
            providers=tuple(self.providers),
            pools=tuple(self.pools),
            headroom_gpus=self.headroom_gpus,
            roles=roles,
            groups=tuple(
                GroupRequest(g.role, g.gpus, g.nodes, g.level, g.sku, g.min_gpu_memory_gib)
                for g in self.groups
            ),
            connect=tuple(ConnectRule(tuple(c.groups), c.level) for c in self.connect),
        )


def _yaml_switch(v: Any) -> Any:
    """YAML 1.1 (PyYAML, what reads every spec file) reads a bare `off` as false and `on` as
    true: `correctness: off`, as documented, arrives as False. A switch means what it says."""
    if v is False:
        return "off"
    if v is True:
        return "auto"
    return v


class GateSpec(_Strict):
    name: Name
    model: str = Field(
        min_length=1,
        max_length=500,
        pattern=r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*$",
        description="the served model name, also `{model}` in argv: letters, digits and "
        "`_./:@+=-`, never starting with '-' (it would read as an option), no `$` (Kubernetes "
        "would expand `$(VAR)`), no spaces",
    )
    reference: EngineSpec
    candidate: EngineSpec
    scenarios: list[ScenarioSpec] = Field(min_length=1, max_length=100)
    shape: ShapeSpec = Field(default_factory=ShapeSpec)
    inventory: str | None = Field(
        default=None, description="inventory YAML; default: settings, then the local example"
    )
    policy: Policy = Field(default_factory=Policy)
    correctness: Annotated[Literal["auto", "off"], BeforeValidator(_yaml_switch)] = Field(
        default="auto",
        description="'auto' (or true): when no scenario is a correctness suite, the gate runs "
        "a short one (the suite's defaults: 8 greedy probes, seconds) after the listed "
        "scenarios, so numerical divergence is judged in every gate; 'off' (or false, what "
        "YAML makes of a bare `off`): none is added (the verdict says so in a note; the load "
        "scenarios' outputs are still compared for gross divergence).",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="seconds the whole gate may take, from its start (waiting for capacity, "
        "launching, every scenario, judging); past it the gate stops and holds naming it. "
        "Default: the operator's GATE_DEADLINE_S; at most GATE_MAX_DEADLINE_S.",
    )

    def engine(self, role: Role) -> EngineSpec:
        return self.reference if role == "reference" else self.candidate

    @property
    def added_correctness(self) -> ScenarioSpec | None:
        """The correctness stage the gate adds (`correctness: auto` and no correctness
        scenario listed), named `correctness` unless a listed scenario has that name."""
        if self.correctness == "off" or any(s.suite == "correctness" for s in self.scenarios):
            return None
        taken = {s.name for s in self.scenarios}
        name = "correctness"
        for i in itertools.count(2):
            if name not in taken:
                break
            name = f"correctness-{i}"
        return ScenarioSpec(name=name, suite="correctness")

    @property
    def stages(self) -> list[ScenarioSpec]:
        """Every scenario the gate runs, in order: the listed ones, then an added
        correctness stage (`added_correctness`)."""
        added = self.added_correctness
        return [*self.scenarios, added] if added is not None else list(self.scenarios)

    @model_validator(mode="after")
    def _unique_scenarios(self) -> GateSpec:
        names = [s.name for s in self.scenarios]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"scenario names must be unique; repeated: {', '.join(dupes)}")
        return self


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(spec)"


def _message(err: Mapping[str, Any]) -> str:
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    return msg


def parse_spec(data: Any, source: str = "spec") -> GateSpec:
    """Validate a spec mapping; raise SpecError naming every mistake."""
    if not isinstance(data, Mapping):
        raise SpecError([FieldProblem("(spec)", "must be a mapping of fields")], source)
    problems: list[FieldProblem] = []
    scenarios = data.get("scenarios")
    if isinstance(scenarios, list):
        for i, sc in enumerate(scenarios):
            if isinstance(sc, Mapping) and isinstance(sc.get("suite"), str):
                if sc["suite"] in SUITES:
                    knobs = {k: v for k, v in sc.items() if k not in SUITE_OWN_KEYS}
                    for field, msg in suite_knob_problems(sc["suite"], knobs):
                        problems.append(FieldProblem(f"scenarios[{i}].{field}", msg))
            elif isinstance(sc, Mapping):
                for field, msg in scenario_cross_field_problems(sc):
                    problems.append(FieldProblem(f"scenarios[{i}].{field}", msg))
    for role in ("reference", "candidate"):
        eng = data.get(role)
        if isinstance(eng, Mapping):
            kinds = [k for k in ENGINE_KINDS if eng.get(k) is not None]
            if len(kinds) != 1:
                problems.append(FieldProblem(role, ENGINE_KIND_MESSAGE))
    shape = data.get("shape")
    if isinstance(shape, Mapping):
        for field, msg in shape_problems(shape):
            problems.append(FieldProblem(f"shape.{field}", msg))
    problems += engine_pair_problems(data)  # rules that tie the two engines together
    try:
        spec = GateSpec.model_validate(dict(data))
    except ValidationError as exc:
        # A cross-field rule fails on the model (path without the field); the raw pass above
        # already named the exact field, so skip the model-level duplicate. Indexed by message
        # so a spec with thousands of mistakes costs linear time, not quadratic.
        raw: dict[str, list[str]] = {}
        for p in problems:
            raw.setdefault(p.message, []).append(p.path)
        for err in exc.errors():
            problem = FieldProblem(_format_loc(tuple(err["loc"])), _message(err))
            if any(path.startswith(problem.path) for path in raw.get(problem.message, ())):
                continue
            problems.append(problem)
        raise SpecError(problems, source) from None
    names = [g.role for g in spec.shape.groups]
    for role in ("reference", "candidate"):  # each engine's groups against the shape's
        problems += engine_group_problems(role, spec.engine(role), names)  # type: ignore[arg-type]
    if problems:  # rules on both engines together (the model passed each alone)
        raise SpecError(problems, source)
    return spec


def load_spec(path: str | Path) -> GateSpec:
    """Read a YAML or JSON spec file and validate it."""
    p = Path(path)
    source = str(p)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise SpecError([FieldProblem("(file)", f"cannot read: {exc.strerror}")], source) from None
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            [FieldProblem("(file)", f"is {size} bytes; the limit is {MAX_SPEC_BYTES}")], source
        )
    text = p.read_text(encoding="utf-8")
    return parse_spec_text(text, source, json_only=p.suffix.lower() == ".json")


def parse_spec_text(text: str, source: str = "spec", *, json_only: bool = False) -> GateSpec:
    try:
        data = json.loads(text) if json_only else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        msg = f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        raise SpecError([FieldProblem("(file)", msg)], source) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        unreadable = FieldProblem("(file)", f"not a spec: {str(exc)[:200]}")
        raise SpecError([unreadable], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            [FieldProblem("(file)", f"invalid YAML{where}: {problem}")], source
        ) from None
    return parse_spec(data, source)


def spec_to_dict(spec: GateSpec) -> dict[str, Any]:
    """The spec as its author wrote it (fields left to their defaults stay out), so that
    `parse_spec(spec_to_dict(spec)) == spec`: stored specs are re-read by workers."""
    return spec.model_dump(mode="json", exclude_unset=True)
