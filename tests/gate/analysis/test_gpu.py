"""The GPU checks (gate/analysis/gpu.py): peak memory and energy per token as ratios against
their tolerances, at and around the boundary; energy from the counter or from power; XID
errors on the candidate alone, on both, on neither; and what is said when a side is missing."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gate.analysis.advisory import mark_advisory
from gate.analysis.gpu import GIB, GpuScenario, GpuSeries, gpu_checks
from gate.analysis.policy import Policy
from gate.analysis.types import Check


def series(
    memory_gib: float = 20.0,
    power_w: float = 300.0,
    *,
    seconds: int = 10,
    counter: bool = True,
    tokens: int = 1000,
    xids: int = 0,
    last: int | None = None,
) -> GpuSeries:
    t = tuple(float(i) for i in range(seconds + 1))
    energy = tuple(1e6 + power_w * s for s in t) if counter else tuple(None for _ in t)
    return GpuSeries(
        t_s=t,
        memory_bytes=tuple(memory_gib * GIB for _ in t),
        power_w=tuple(power_w for _ in t),
        energy_j=energy,
        xid_count=xids,
        xid_last=last,
        output_tokens=tokens,
    )


def by_id(ref: GpuSeries, cand: GpuSeries, policy: Policy | None = None) -> dict[str, Check]:
    notes: list[str] = []
    checks = gpu_checks([GpuScenario("steady", ref, cand)], policy or Policy(), notes)
    return {c.id: c for c in checks}


def test_peak_memory_holds_above_its_tolerance_and_passes_at_it() -> None:
    held = by_id(series(20.0), series(22.1))["gpu.memory"]
    assert held.decision == "fail" and held.holds
    assert held.ratio == pytest.approx(1.105)
    assert "22.10 GiB against the reference's 20.00 GiB" in held.message
    at = by_id(series(20.0), series(22.0))["gpu.memory"]
    assert at.decision == "pass"
    loose = by_id(series(20.0), series(22.1), Policy(gpu={"memory_tolerance": 0.2}))
    assert loose["gpu.memory"].decision == "pass"


def test_the_peak_is_the_largest_read_of_any_scenario() -> None:
    bump = series(20.0)
    spiky = GpuSeries(
        bump.t_s,
        (*bump.memory_bytes[:-1], 30.0 * GIB),
        bump.power_w,
        bump.energy_j,
        output_tokens=1000,
    )
    notes: list[str] = []
    checks = gpu_checks(
        [GpuScenario("a", series(20.0), series(20.0)), GpuScenario("b", series(20.0), spiky)],
        Policy(),
        notes,
    )
    memory = next(c for c in checks if c.id == "gpu.memory")
    assert memory.decision == "fail" and memory.candidate == pytest.approx(30.0)


def test_energy_per_token_from_the_counter_and_from_power_agree() -> None:
    # 300 W for 10 s over 1000 tokens: 3 J a token, whichever way it is measured
    for counter in (True, False):
        c = by_id(series(counter=counter), series(power_w=345.0, counter=counter))
        check = c["gpu.energy_per_token"]
        assert check.reference == pytest.approx(3.0)
        assert check.ratio == pytest.approx(1.15)
        assert check.decision == "fail"


def test_energy_per_token_counts_tokens_not_time() -> None:
    # the same power, twice the tokens: half the energy per token, a pass
    c = by_id(series(tokens=1000), series(tokens=2000))["gpu.energy_per_token"]
    assert c.ratio == pytest.approx(0.5) and c.decision == "pass"
    assert c.samples == (1000, 2000)


def test_a_counter_that_went_back_is_integrated_from_power_instead() -> None:
    s = series()
    reset = GpuSeries(
        s.t_s, s.memory_bytes, s.power_w, (5000000.0, *s.energy_j[1:]), output_tokens=1
    )
    assert reset.energy() == pytest.approx(3000.0)


def test_a_counter_reset_midway_is_not_read_as_a_smaller_rise() -> None:
    s = series(seconds=4)  # 1e6, +300 J a second; a driver reload at t=2 restarts it near 0
    reset = GpuSeries(
        s.t_s,
        s.memory_bytes,
        s.power_w,
        (1e6, 1e6 + 300, 10.0, 1e6 + 1e3, 1e6 + 1300),
        output_tokens=1,
    )
    assert reset.energy() == pytest.approx(1200.0)  # from power, not 1300 - 0 by chance


def test_failed_reads_on_one_side_do_not_cut_its_energy() -> None:
    """A/A, same power throughout; the reference's tool timed out for 15 of 60 reads (and
    its first and last): its energy is bridged over the gap, not dropped, so no false hold."""
    full = series(seconds=60, counter=False)
    gaps = tuple(None if 20 <= i < 35 or i in (0, 60) else w for i, w in enumerate(full.power_w))
    ref = GpuSeries(full.t_s, full.memory_bytes, gaps, full.energy_j, output_tokens=1000)
    assert ref.energy() == pytest.approx(full.energy() or 0.0)
    c = by_id(ref, full)["gpu.energy_per_token"]
    assert c.decision == "pass" and c.ratio == pytest.approx(1.0)
    # the counter spans a gap in its own reads exactly
    counted = series(seconds=60)
    holes = tuple(None if 20 <= i < 35 else e for i, e in enumerate(counted.energy_j))
    gapped = GpuSeries(counted.t_s, counted.memory_bytes, gaps, holes, output_tokens=1000)
    assert gapped.energy() == pytest.approx(300.0 * 60)


def test_xid_on_the_candidate_alone_holds() -> None:
    c = by_id(series(), series(xids=2, last=79))["gpu.xid"]
    assert c.decision == "fail" and "2 XID error(s)" in c.message and "XID 79" in c.message


def test_xid_on_both_is_the_test_beds_warning_not_a_hold() -> None:
    c = by_id(series(xids=1, last=48), series(xids=1, last=79))["gpu.xid"]
    assert not c.holds and c.warning and c.metric == "environment"
    assert by_id(series(xids=1, last=48), series())["gpu.xid"].decision == "pass"


def test_no_gpu_read_is_one_note_and_no_check() -> None:
    notes: list[str] = []
    why = "No GPU is visible to the gate (...)"
    checks = gpu_checks(
        [GpuScenario("a", None, None, why), GpuScenario("b", None, None, why)], Policy(), notes
    )
    assert checks == [] and notes == [why]


def test_one_side_read_is_left_out_with_a_note() -> None:
    notes: list[str] = []
    assert gpu_checks([GpuScenario("a", series(), None)], Policy(), notes) == []
    assert "Only one engine's GPUs were read in a" in notes[0]


@pytest.mark.parametrize(
    ("knob", "value"), [("memory_tolerance", -0.1), ("energy_tolerance", 11), ("other", 1)]
)
def test_policy_knobs_are_bounded_and_named(knob: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        Policy(gpu={knob: value})
    assert f"gpu.{knob}" in str(err.value)


def test_a_gpu_check_may_be_advisory_and_then_never_holds() -> None:
    """`policy.advisory: [gpu.memory]` is a pattern that meets a check the judge builds
    (advisory.py families), and the footprint that held above is then listed, not holding."""
    policy = Policy(advisory=["gpu.memory"])
    notes: list[str] = []
    checks = mark_advisory(
        gpu_checks([GpuScenario("steady", series(20.0), series(30.0))], policy, notes), policy
    )
    memory = next(c for c in checks if c.id == "gpu.memory")
    assert memory.decision == "fail" and memory.advisory and not memory.holds
    with pytest.raises(ValidationError, match="advisory"):
        Policy(advisory=["gpu.temperature"])  # no such GPU check


def late(s: GpuSeries, by_s: float, extra_idle_s: float, idle_w: float) -> GpuSeries:
    """`s`'s engine read `by_s` later at every read, and once more `extra_idle_s` after its last
    read, idle: what a busy host's sampler records for the engine it reads second."""
    t = (*(t + by_s for t in s.t_s), s.t_s[-1] + by_s + extra_idle_s)
    last = s.energy_j[-1]
    energy = (
        *(None if e is None else e + idle_w * by_s for e in s.energy_j),
        None if last is None else last + idle_w * (by_s + extra_idle_s),
    )
    return GpuSeries(
        t_s=t,
        memory_bytes=(*s.memory_bytes, s.memory_bytes[-1]),
        power_w=(*s.power_w, idle_w),
        energy_j=energy,
        output_tokens=s.output_tokens,
    )


@pytest.mark.parametrize("counter", [True, False])
def test_energy_is_compared_over_the_span_both_engines_were_read(counter: bool) -> None:
    """The sampler stamps each engine's reads when they were made (gate/telemetry/sampler.py):
    on a busy host the candidate, read second, can be read seconds later and once more after
    the load, idle. Over its own span it would be charged that idle power (here 3 s of 300 W
    on 3,000 J: 30% more, a hold at the 10% tolerance); over the span both were read in it is
    charged what the reference is."""
    ref = series(counter=counter)
    cand = late(series(counter=counter), by_s=0.5, extra_idle_s=2.5, idle_w=300.0)
    check = by_id(ref, cand)["gpu.energy_per_token"]
    assert check.decision == "pass", check.message
    assert check.ratio == pytest.approx(1.0, abs=0.06)
    # a candidate that really spends more is still held over the same span
    hungry = late(series(power_w=345.0, counter=counter), 0.5, 2.5, 345.0)
    assert by_id(ref, hungry)["gpu.energy_per_token"].decision == "fail"


@pytest.mark.parametrize("reads", [4, 5])
def test_energy_from_too_few_power_reads_is_said_not_judged(reads: int) -> None:
    """Without a counter, energy is power integrated between reads. A side read only a few
    times over the span both were read in (a stand-in nvidia-smi, a process per read, on a
    host whose cores real vLLM held: an A/A ratio of 0.58 in one CI run) is left out with a
    note naming the side, its reads and the way to more; with MIN_POWER_READS (5) it is
    judged. A counter's rise needs no more than its ends."""
    ref = series(counter=False)
    # the candidate ramps up within the span: 100 W, then 300 W; read `reads` times
    t = tuple(float(x) for x in np.linspace(0.0, 10.0, reads))
    watts = tuple(100.0 if x < 3.0 else 300.0 for x in t)
    cand = GpuSeries(t, tuple(20 * GIB for _ in t), watts, tuple(None for _ in t), 0, None, 1000)
    notes: list[str] = []
    checks = gpu_checks([GpuScenario("steady", ref, cand)], Policy(), notes)
    ids = {c.id for c in checks}
    if reads < 5:
        assert "gpu.energy_per_token" not in ids and "gpu.memory" in ids
        [said] = [n for n in notes if n.startswith("Energy per output token was not compared")]
        assert f"the candidate's GPU power was read {reads} time(s)" in said
        assert "steady" in said and "interval_s" in said
    else:
        assert "gpu.energy_per_token" in ids, notes
    # the same sparse reads with a counter are a rise between two of them: judged
    counted = GpuSeries(
        t, cand.memory_bytes, watts, tuple(1e6 + 250.0 * x for x in t), 0, None, 1000
    )
    assert "gpu.energy_per_token" in by_id(ref, counted)
