"""A stand-in for `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]` over the
sim's simulated GPUs (simengine/gpu.py: one INDEX.json per GPU in $SIMENGINE_GPU_STATE_DIR),
for machines without a GPU: tests and `gate calibrate --engines` put it on PATH as
`nvidia-smi` (`install`), so the gate reads a sim engine's GPUs exactly as a real one's.

Its output is nvidia-smi's, byte for byte in the fields it knows: one line per GPU in index
order, values in the order asked, separated by ", "; numbers as the driver prints them
(memory in whole MiB, power with two decimals, utilisation in whole percent) followed by
" MiB", " W", " %" unless `nounits`; with a header line unless `noheader`, each name followed
by its unit in brackets ("memory.used [MiB]"). The source of that format is a capture of the
real tool (driver 590.48.01, H100) in tests/support/captures/nvidia-smi/, whose README cites
it; tests/simengine/test_nvidia_smi.py compares the two.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simengine.gpu import STATE_DIR_ENV

Render = Callable[[dict[str, Any]], str]

FIELDS: dict[str, tuple[str, Render]] = {
    "index": ("", lambda s: str(s["index"])),
    "uuid": ("", lambda s: str(s["uuid"])),
    "name": ("", lambda s: str(s["name"])),
    "driver_version": ("", lambda s: str(s["driver_version"])),
    "pci.bus_id": ("", lambda s: str(s["pci_bus_id"])),
    "memory.total": ("MiB", lambda s: f"{int(s['memory_total_mib'])}"),
    "memory.used": ("MiB", lambda s: f"{int(s['memory_used_mib'])}"),
    "memory.free": ("MiB", lambda s: f"{int(s['memory_total_mib'] - s['memory_used_mib'])}"),
    "power.draw": ("W", lambda s: f"{float(s['power_w']):.2f}"),
    "utilization.gpu": ("%", lambda s: f"{int(s['utilization_pct'])}"),
}


def states(directory: Path) -> list[dict[str, Any]]:
    out = []
    for path in directory.glob("*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # replaced while read: the next read has it
    return sorted(out, key=lambda s: int(s["index"]))


def _option(argv: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
    return None


def render(gpus: list[dict[str, Any]], fields: list[str], header: bool, units: bool) -> list[str]:
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{FIELDS[f][0]}]" if FIELDS[f][0] else f for f in fields))
    for s in gpus:
        cells = []
        for f in fields:
            unit, value = FIELDS[f]
            cells.append(f"{value(s)} {unit}" if units and unit else value(s))
        lines.append(", ".join(cells))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    query, fmt = _option(args, "--query-gpu"), _option(args, "--format")
    if query is None or fmt is None:
        print("stand-in nvidia-smi: only --query-gpu=FIELDS --format=csv[...]", file=sys.stderr)
        return 2
    fields = [f.strip() for f in query.split(",") if f.strip()]
    for f in fields:
        if f not in FIELDS:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            return 2
    options = {o.strip() for o in fmt.split(",")}
    ids = _option(args, "-i", "--id")
    directory = os.environ.get(STATE_DIR_ENV)
    gpus = states(Path(directory)) if directory else []
    if ids is not None:
        wanted = {int(i) for i in ids.split(",") if i.strip().isdigit()}
        gpus = [s for s in gpus if int(s["index"]) in wanted]
    if not gpus:
        print("No devices were found")
        return 6
    lines = render(gpus, fields, "noheader" not in options, "nounits" not in options)
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


def install(bin_dir: Path, python: str = sys.executable) -> Path:
    """An executable `nvidia-smi` in `bin_dir` that runs this stand-in: put `bin_dir` first on
    PATH and the gate's nvidia-smi source reads the sim's GPUs."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(f'#!/bin/sh\nexec "{python}" -m simengine.nvidia_smi "$@"\n')
    path.chmod(0o755)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
