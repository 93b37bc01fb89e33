"""The gate's nvidia-smi parser against the real tool's output (tests/support/captures/
nvidia-smi/README.md: an H100 on driver 590.48.01, idle and under load), and a source that
runs an executable named nvidia-smi found on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gate.core.errors import TelemetryError
from gate.telemetry.gpu import MIB
from gate.telemetry.nvidia_smi import FIELDS, NvidiaSmiSource, find_query, parse_query

CAPTURES = Path(__file__).parents[2] / "support" / "captures" / "nvidia-smi"


def nounits_line(capture: str, fields: tuple[str, ...] = FIELDS) -> str:
    """The capture's GPU line for `fields`, as `--format=csv,noheader,nounits` prints it: the
    same values in the order asked, without the units that `nounits` leaves out."""
    header, row = (CAPTURES / capture).read_text().splitlines()
    names = [h.split(" [")[0] for h in header.split(", ")]
    values = dict(zip(names, row.split(", "), strict=True))
    units = {
        n: h.split(" [")[1].rstrip("]")
        for n, h in zip(names, header.split(", "), strict=True)
        if " [" in h
    }
    out = []
    for f in fields:
        v = values[f]
        if f in units and v.endswith(" " + units[f]):
            v = v[: -len(units[f]) - 1]
        out.append(v)
    return ", ".join(out)


def test_the_load_capture_reads_as_the_gpu_was() -> None:
    (gpu,) = parse_query(nounits_line("h100-590.48.01-load.csv") + "\n")
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.driver == "590.48.01"
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu.memory_used_bytes == 19818 * MIB and gpu.memory_total_bytes == 81559 * MIB
    assert gpu.power_w == pytest.approx(631.95) and gpu.utilization_pct == 100
    assert gpu.energy_j is None and gpu.xids == ()  # nvidia-smi's query has neither


def test_the_idle_capture_and_the_tools_placeholders() -> None:
    (idle,) = parse_query(nounits_line("h100-590.48.01-idle.csv"))
    assert idle.utilization_pct == 0 and idle.power_w is not None and idle.power_w < 100
    # A value the GPU does not report, as the capture prints one (this H100 has no fan):
    # asked in the place of power and utilisation, it reads as unknown, not as a number.
    asked = (*FIELDS[:6], "fan.speed", "fan.speed")
    line = nounits_line("h100-590.48.01-idle.csv", asked)
    assert line.endswith(", [N/A], [N/A]")
    (gpu,) = parse_query(line)
    assert gpu.power_w is None and gpu.utilization_pct is None
    assert gpu.memory_total_bytes == 81559 * MIB


def test_a_line_of_the_wrong_width_is_refused_naming_the_fields() -> None:
    with pytest.raises(TelemetryError, match="line 2: 3 values for the 8 fields asked"):
        parse_query(nounits_line("h100-590.48.01-load.csv") + "\n0, a, b\n")


def test_the_source_runs_nvidia_smi_from_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in executable on PATH answering with the capture's line: the source finds it,
    keeps the GPUs asked for, and a failing tool is TelemetryError with its message."""
    line = nounits_line("h100-590.48.01-load.csv")
    other = line.replace("0, GPU-0000", "5, GPU-5555", 1)
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '%s\\n%s\\n' '{line}' '{other}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    query = find_query()
    assert query is not None and query.program == str(tool)
    assert [g.index for g in NvidiaSmiSource([5], query).read()] == [5]
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver is loaded' >&2\nexit 9\n")
    with pytest.raises(TelemetryError, match="nvidia-smi exited 9: NVIDIA-SMI has failed"):
        NvidiaSmiSource([0], type(query)(str(tool))).read()
