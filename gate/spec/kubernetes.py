"""A kubernetes engine: an image run as pods on the nodes the gate reserves, with its worker
groups and router (`gate/engines/kubernetes.py` makes the objects).
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gate.core.errors import FieldProblem
from gate.spec.fields import (
    ANY_PLACEHOLDER_RE,
    GROUP_PLACEHOLDERS,
    GROUP_REF_RE,
    MAX_URL_CHARS,
    StrictModel,
)

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


class SecretKeyRef(StrictModel):
    """One key of a Secret in the engine's namespace, e.g. a Hugging Face token."""

    secret: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)

    @field_validator("secret")
    @classmethod
    def _secret_ok(cls, v: str) -> str:
        if not DNS_SUBDOMAIN_RE.match(v):
            raise ValueError("must be a Secret name (lower-case DNS subdomain)")
        return v


def _kubernetes_argv_problem(v: list[str] | None) -> str | None:
    """The first unknown placeholder of a kubernetes argv; group placeholders ({role},
    {group_gpus}, {url:GROUP}...) pass here and are checked against the engine's groups."""
    for item in v or []:
        for name in ANY_PLACEHOLDER_RE.findall(item):
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


_T = TypeVar("_T", list[str], list[str] | None)
_E = TypeVar("_E", bound=dict[str, Any])


def _checked_argv(v: _T, field: str | None) -> _T:
    """An argv field of a kubernetes engine, group or router: known placeholders only, and
    no shell in a command (the first item of the argv)."""
    problem = _kubernetes_argv_problem(v)
    if problem is None and v and field in ("command", "worker_command"):
        problem = _argv_shell_problem(v, "argv")
    if problem is not None:
        raise ValueError(problem)
    return v


def _checked_env(v: _E) -> _E:
    for name in v:
        if not ENV_NAME_RE.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
    return v


class KubernetesGroupSpec(StrictModel):
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
        return _checked_argv(v, info.field_name)

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        return _checked_env(v)


class KubernetesRouterSpec(StrictModel):
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
        return _checked_argv(v, info.field_name)

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        return _checked_env(v)

    @model_validator(mode="after")
    def _argv_given(self) -> KubernetesRouterSpec:
        if not self.command and not self.args:
            raise ValueError("give the router's `command` and/or `args`")
        problem = _argv_shell_problem([*self.command, *self.args], "command/args")
        if problem is not None:
            raise ValueError(problem)
        return self


class KubernetesSpec(StrictModel):
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
        return _checked_argv(v, info.field_name)

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names_ok(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _checked_env(v)

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
                for n in ANY_PLACEHOLDER_RE.findall(item)
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
            for ph in ANY_PLACEHOLDER_RE.findall(item):
                m = GROUP_REF_RE.match(ph)
                if m and m.group(2) not in k.groups:
                    out.append(FieldProblem(path, f"{{{ph}}} names no group of this engine"))
    return out
