"""The simulated gate of the calibration (gate/analysis/calibration_sim.py): its reference p95,
the dependence models' common part, and error bursts at the stated rate."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gate.analysis.calibration import MODELS
from gate.analysis.calibration_sim import Case, SimConfig, _errors, simulated_gate, tail_threshold


def test_tail_threshold_is_the_reference_p95() -> None:
    rng = np.random.default_rng(0)
    config = SimConfig()
    sigma = np.hypot(config.ttft_sigma, config.batch_sigma)
    x = config.ttft_ms * np.exp(rng.normal(0.0, sigma, 200_000))
    assert np.mean(x > tail_threshold(config)) == pytest.approx(0.05, abs=0.003)


def test_dependence_models_share_the_common_part_and_not_the_batches() -> None:
    """The mirrored model: both engines' log latencies share the common part request by
    request (their log ratio has no trace of it), and each engine's batches are its own."""
    mirrored = next(m for m in MODELS if m.name == "mirrored")
    config = replace(SimConfig().with_model(mirrored), limit=4_000, drift=0.0, divergence=False)
    g = simulated_gate(Case("A/A"), config, 5, np.random.default_rng(4))
    ok = ~np.isnan(g.ref.ttft) & ~np.isnan(g.cand.ttft)
    lr, lc = np.log(g.ref.ttft[ok]), np.log(g.cand.ttft[ok])
    total = np.sqrt(mirrored.common**2 + mirrored.batch_sd**2 + mirrored.own**2)
    assert np.std(lr) == pytest.approx(total, rel=0.1)
    # What the pair does not share: twice an engine's batch and own variance.
    own = np.sqrt(2 * (mirrored.batch_sd**2 + mirrored.own**2))
    assert np.std(lc - lr) == pytest.approx(own, rel=0.1)
    assert g.divergence is None


def test_error_bursts_fail_consecutive_requests_at_the_same_rate() -> None:
    rng = np.random.default_rng(9)
    err = _errors(rng, 200_000, 0.01, burst=4)
    failed = err >= 0
    assert failed.mean() == pytest.approx(0.01, rel=0.1)
    starts = failed & ~np.concatenate([[False], failed[:-1]])
    runs = failed.sum() / starts.sum()
    assert 3.5 < runs < 4.5  # bursts of four (two that touch read as one longer burst)
    single = _errors(np.random.default_rng(9), 200_000, 0.01)
    assert (single >= 0).mean() == pytest.approx(0.01, rel=0.1)
