"""The hardware and software a gate ran on (`PlatformDoc`): this host, the gate's version, the
GPUs `nvidia-smi` lists here, and per engine what it answered on `/version`, its program or
preset, and a Kubernetes engine's image and the digest its pod runs.

GPUs are read from `nvidia-smi --query-gpu=name,driver_version,memory.total
--format=csv,noheader,nounits` (NVIDIA's documented query form; one line per GPU, comma
separated). A host without it, or whose call fails, lists none and says why: the figures of
its gates are then compared across hosts by `host` only. Kubernetes engines' GPUs are their
nodes' (the placement's `sku`), not this host's.
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
from importlib import metadata

from gate.core.vocabulary import ROLES, Role
from gate.spec import EngineSpec, GateSpec
from gate.spec.identity import is_aa, spec_identity
from gate.verdict.document import EngineSoftwareDoc, GpuDoc, PlatformDoc

NVIDIA_SMI_TIMEOUT_S = 5.0
NVIDIA_SMI_QUERY = [
    "--query-gpu=name,driver_version,memory.total",
    "--format=csv,noheader,nounits",
]
Version = tuple[str | None, str | None]  # (version, why there is none)


def gate_version() -> str:
    try:
        return metadata.version("llm-deploy-gate")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def parse_nvidia_smi(text: str) -> list[GpuDoc]:
    """The GPUs of `nvidia-smi` CSV lines (module docstring); a line that does not fit is
    skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0]:
            continue
        memory = int(parts[2]) if parts[2].isdigit() else None
        gpus.append(GpuDoc(model=parts[0], driver=parts[1] or None, memory_mib=memory))
    return gpus


def visible_gpus() -> tuple[list[GpuDoc], str | None]:
    """This host's GPUs, or none and why."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "not visible: no nvidia-smi on the gate's host"
    try:
        done = subprocess.run(
            [smi, *NVIDIA_SMI_QUERY],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"not visible: nvidia-smi failed ({type(exc).__name__})"
    gpus = parse_nvidia_smi(done.stdout) if done.returncode == 0 else []
    if not gpus:
        return [], f"not visible: nvidia-smi listed none (exit {done.returncode})"
    return gpus, None


def engine_software(es: EngineSpec, version: Version, digest: str | None) -> EngineSoftwareDoc:
    program = None
    if es.preset is not None:
        program = f"preset:{es.preset}"
    elif es.command:  # `python -m simengine` says more than `python`
        interpreter = es.command[0].rsplit("/", 1)[-1].startswith("python")
        program = " ".join(es.command[:3] if interpreter else es.command[:1])
    image = es.kubernetes.image if es.kubernetes is not None else None
    return EngineSoftwareDoc(
        version=version[0],
        version_note=version[1],
        program=program,
        image=image,
        image_digest=digest,
    )


def describe_testbed(
    spec: GateSpec,
    versions: dict[Role, Version],
    digests: dict[Role, str | None],
) -> PlatformDoc:
    """The test bed of a run of `spec`; engines never asked say so."""
    gpus, note = visible_gpus()
    never: Version = (None, "not asked: the gate stopped before the engines were ready")
    return PlatformDoc(
        host=socket.gethostname(),
        gate_version=gate_version(),
        python=platform.python_version(),
        platform=platform.platform(terse=True),
        gpus=gpus,
        gpu_note=note,
        engines={
            role: engine_software(spec.engine(role), versions.get(role, never), digests.get(role))
            for role in ROLES
        },
        identity=spec_identity(spec),
        aa=is_aa(spec),
    )
