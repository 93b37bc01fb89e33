"""The DCGM exporter's text read with prometheus-client's parser (gate/telemetry/dcgm.py):
the default counters of the reserved GPUs picked by host and index, in the gate's units; and
the same read over HTTP from the stand-in exporter (simengine/dcgm_exporter.py), whose text is
the fixture's byte for byte (tests/support/captures/dcgm-exporter/README.md cites the
exporter's template each line follows), including an XID counted once it changes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate.core.errors import TelemetryError
from gate.telemetry.dcgm import DcgmSource, parse_exposition, reading, select
from gate.telemetry.gpu import MIB
from simengine.dcgm_exporter import render
from simengine.gpu import STATE_DIR_ENV

FIXTURE = Path(__file__).parents[2] / "support" / "captures" / "dcgm-exporter"
POD = {"container": "engine", "namespace": "gates", "pod": "gate-5a1e-candidate"}


def state(index: int, **values: object) -> dict[str, object]:
    """A simulated GPU as simengine/gpu.py writes it."""
    return {
        "index": index,
        "uuid": f"GPU-5a1e0000-0000-4000-8000-{index:012d}",
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "590.48.01",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "memory_total_mib": 81559,
        **values,
    }


FIXTURE_STATES = [
    state(
        2, memory_used_mib=19818, power_w=631.95, energy_mj=2210045112, utilization_pct=100, xids=[]
    ),
    state(
        3, memory_used_mib=528, power_w=118.42, energy_mj=1902330561, utilization_pct=0, xids=[13]
    ),
]


def test_the_fixture_reads_as_each_reserved_gpu() -> None:
    scraped = parse_exposition((FIXTURE / "default-counters.txt").read_text())
    gpus = select(scraped, "gpu-node-a", [2, 3])
    two = reading(2, gpus[2])
    assert two.name == "NVIDIA H100 80GB HBM3" and two.driver == "590.48.01"
    assert two.host == "gpu-node-a" and two.uuid == "GPU-5a1e0000-0000-4000-8000-000000000002"
    assert two.memory_used_bytes == 19818 * MIB
    assert two.memory_total_bytes == (19818 + 61741) * MIB
    assert two.power_w == pytest.approx(631.95) and two.utilization_pct == 100
    assert two.energy_j == pytest.approx(2210045.112)  # mJ since boot, in J
    assert select(scraped, "gpu-node-b", [2]) == {}  # another node's GPU 2 is not ours
    assert set(select(scraped, "gpu-node-a", [3, 7])) == {3}


def test_the_stand_in_exporter_prints_the_fixture_byte_for_byte() -> None:
    text = render(FIXTURE_STATES, "gpu-node-a", POD)
    assert text == (FIXTURE / "default-counters.txt").read_text()


def test_the_hostname_label_of_newer_exporters_and_of_none() -> None:
    lower = render(FIXTURE_STATES, "gpu-node-a", POD, host_label="hostname")
    assert set(select(parse_exposition(lower), "gpu-node-a", [2, 3])) == {2, 3}
    hostless = re.sub(r',Hostname="[^"]*"', "", render(FIXTURE_STATES, "x", POD))
    assert set(select(parse_exposition(hostless), "any-node", [2])) == {2}


def test_text_that_is_not_prometheus_is_named() -> None:
    with pytest.raises(TelemetryError, match="DCGM exporter: not Prometheus text"):
        parse_exposition('DCGM_FI_DEV_FB_USED{gpu="0" 12\n')
    with pytest.raises(TelemetryError, match="gpu label 'GPU-0', not an index"):
        parse_exposition('DCGM_FI_DEV_FB_USED{gpu="GPU-0"} 12\n')


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    env = {STATE_DIR_ENV: str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simengine.dcgm_exporter",
            "--hostname",
            "gpu-node-a",
            "--pod",
            "gate-5a1e-candidate",
            "--namespace",
            "gates",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, **env},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ")[1].strip() + "/metrics"
        yield url, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_source_reads_the_stand_in_over_http(exporter: tuple[str, Path]) -> None:
    url, states = exporter
    for s in FIXTURE_STATES:
        (states / f"{s['index']}.json").write_text(json.dumps(s))
    source = DcgmSource(url, [("gpu-node-a", (2, 3))])
    first = {g.index: g for g in source.read()}
    assert first[2].memory_used_bytes == 19818 * MIB and first[3].power_w == pytest.approx(118.42)
    assert first[3].xids == ()  # XID 13 was there before: the baseline, not the candidate's
    (states / "2.json").write_text(json.dumps({**FIXTURE_STATES[0], "xids": [79]}))
    second = {g.index: g for g in source.read()}
    assert second[2].xids == (79,) and second[3].xids == ()
    assert {g.index: g.xids for g in source.read()} == {2: (), 3: ()}  # counted once
    with pytest.raises(TelemetryError, match="answered HTTP 404"):
        DcgmSource(url.replace("/metrics", "/nothing"), [("gpu-node-a", (2,))]).read()
