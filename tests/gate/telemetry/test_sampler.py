"""The sampler (gate/telemetry/sampler.py) and the Prometheus source against a real sim
process over real HTTP: timelines on the gate's clock, gaps for failed scrapes (never a crash),
bounds on points, series and bytes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from gaterun import wait_for

from gate.core.errors import TelemetryError
from gate.telemetry import PrometheusSource, Sample, Sampler
from simengine.launch import SimPool

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[SimPool]:
    with SimPool(workdir=tmp_path, cwd=REPO_ROOT) as p:
        yield p


class Flaky:
    """A source that fails every other read."""

    name = "flaky"

    def __init__(self) -> None:
        self.n = 0

    def read(self) -> Sequence[Sample]:
        self.n += 1
        if self.n % 2 == 0:
            raise TelemetryError("no answer")
        return [
            Sample("requests_waiting", float(self.n)),
            Sample("block_size", math.nan, text="16"),
        ]


def test_a_failed_read_is_a_gap_and_the_bounds_hold() -> None:
    clock = iter(range(0, 10**12, 250_000_000))  # 0.25 s a reading of the clock
    sampler = Sampler(
        {"reference": [Flaky()]},
        interval_s=0.25,
        max_points=5,
        zero_ns=0,
        clock_ns=lambda: next(clock),
    )
    for _ in range(8):
        sampler.tick()
    tl = sampler.timelines["reference"]
    # stamped at the middle of each tick's reads: the clock read before (0) and after (0.25)
    assert tl.t_s == [0.125, 0.625, 1.125, 1.625, 2.125]
    assert tl.series["requests_waiting"] == [1.0, None, 3.0, None, 5.0]
    assert tl.gaps == 2 and tl.config == {"block_size": "16"}
    assert "flaky: no answer" in tl.notes
    assert "sampling stopped after 5 scrapes" in tl.notes


def test_the_sampler_thread_reads_a_real_sim_and_survives_its_end(pool: SimPool) -> None:
    sim = pool.start("--num-gpu-blocks-override", "300", "--max-model-len", "1024")
    src = PrometheusSource("sim", f"{sim.url}/metrics", timeout_s=1.0)
    sampler = Sampler({"candidate": [src]}, interval_s=0.05)
    sampler.start()
    live = sampler.timelines["candidate"]
    # scrapes, not seconds: a loaded CI host took over 0.4 s to answer the first one
    wait_for(lambda: "kv_cache_blocks" in live.config and live.t_s, 60, "a first scrape")
    sim.proc.kill()
    sim.proc.wait()
    # the engine is gone: scrapes fail, the sampler carries on
    wait_for(lambda: live.gaps >= 1, 60, "a failed scrape")
    tl = sampler.stop()["candidate"]
    assert tl.config["kv_cache_blocks"] == "300" and tl.config["kv_cache_tokens"] == "4800"
    assert tl.series["preemptions_total"][0] == 0.0
    assert tl.gaps >= 1 and any("ConnectError" in n for n in tl.notes)
    assert len(tl.t_s) == len(tl.series["requests_running"])
    assert tl.t_s == sorted(tl.t_s)
    assert sampler.cpu_s > 0


def test_an_answer_past_the_byte_bound_is_refused(pool: SimPool) -> None:
    sim = pool.start()
    src = PrometheusSource("sim", f"{sim.url}/metrics", max_bytes=200)
    with pytest.raises(TelemetryError, match="over 200 bytes"):
        src.read()
    src.max_bytes = 1 << 20
    assert any(s.metric == "requests_running" for s in src.read())
    src.close()


class Slow:
    """A source whose read takes `took_s` on the test's clock (an nvidia-smi on a busy host)."""

    name = "slow"

    def __init__(self, clock: list[float], took_s: float) -> None:
        self.clock, self.took_s = clock, took_s

    def read(self) -> Sequence[Sample]:
        self.clock[0] += self.took_s
        return [Sample("requests_waiting", self.clock[0])]


def test_each_role_is_stamped_when_it_was_read() -> None:
    """Roles are read one after the other: a candidate read after the reference's 2 s of reads
    is stamped 2 s later, not at the tick's start (gate/analysis/gpu.py integrates energy
    between these stamps)."""
    now = [10.0]
    sampler = Sampler(
        {"reference": [Slow(now, 2.0)], "candidate": [Slow(now, 0.2)]},
        zero_ns=0,
        clock_ns=lambda: int(now[0] * 1e9),
    )
    sampler.tick()
    ref, cand = sampler.timelines["reference"], sampler.timelines["candidate"]
    assert ref.t_s == [pytest.approx(11.0)] and cand.t_s == [pytest.approx(12.1)]
