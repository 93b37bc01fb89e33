"""The mirrored load outputs compared (gate/analysis/outputs.py): where a pair parts, what a
scenario's comparison counts, and the gross-divergence rule's error rate under dependence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from gate.analysis.outputs import (
    BLOCKS,
    HISTOGRAM_BINS,
    MIN_BLOCK,
    MirroredOutputs,
    Output,
    block_counts,
    common_prefix,
    compare_outputs,
    first_divergence,
    gross_threshold,
    hoeffding_p,
    is_prefix,
    mirrored_output_checks,
)
from gate.analysis.policy import Policy

POLICY = Policy()


def ids(*xs: int) -> Output:
    return Output(text="".join(f"<{x}>" for x in xs), tokens=len(xs), token_ids=list(xs))


# -- where a pair parts -------------------------------------------------------------------


def test_token_ids_give_the_exact_position() -> None:
    assert first_divergence(ids(1, 2, 3), ids(1, 2, 3)) == (None, "token_ids")
    assert first_divergence(ids(1, 2, 3), ids(1, 9, 3)) == (1, "token_ids")
    assert first_divergence(ids(1, 2, 3), ids(7, 2, 3)) == (0, "token_ids")
    # one output a prefix of the other: they part where the shorter one ends
    assert first_divergence(ids(1, 2, 3), ids(1, 2)) == (2, "token_ids")
    assert first_divergence(ids(1, 2), ids(1, 2, 3)) == (2, "token_ids")


def test_text_is_compared_where_either_side_lacks_ids() -> None:
    # An engine without return_token_ids (llama.cpp, TensorRT-LLM): text on both sides, the
    # position estimated by the reference's characters per token (4 here).
    a = Output(text="abcdEFGHijkl", tokens=3)
    assert first_divergence(a, Output(text="abcdEFGHijkl", tokens=3)) == (None, "text")
    assert first_divergence(a, Output(text="abcdEFxHijkl", tokens=3)) == (1, "text")
    assert first_divergence(a, Output(text="Xbcd", tokens=1)) == (0, "text")
    assert first_divergence(ids(1, 2), Output(text="<1><2>", tokens=2)) == (None, "text")


@given(
    st.text(alphabet="ab", min_size=0, max_size=40),
    st.text(alphabet="ab", min_size=0, max_size=40),
    st.integers(0, 50),
)
def test_an_estimated_position_stays_inside_the_reference(ta: str, tb: str, n: int) -> None:
    at, basis = first_divergence(Output(ta, n), Output(tb, n))
    assert basis == "text"
    assert (at is None) == (ta == tb)
    if at is not None:
        assert 0 <= at <= max(n - 1, 0)


@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_the_position_is_the_first_index_that_differs(a: list[int], b: list[int]) -> None:
    at, _ = first_divergence(ids(*a), ids(*b))
    if a == b:
        assert at is None
    else:
        assert at is not None and a[:at] == b[:at]
        assert at == min(len(a), len(b)) or a[at] != b[at]


# -- one scenario's comparison ------------------------------------------------------------


def test_a_scenario_counts_pairs_both_engines_answered() -> None:
    ref = {0: ids(1, 2, 3, 4), 1: ids(1, 2, 3, 4), 2: ids(5, 6), 3: ids(1), 4: ids(1, 1)}
    cand = {0: ids(1, 2, 3, 4), 1: ids(1, 2, 9, 9), 2: ids(7, 6), 3: Output("", 0), 5: ids(1)}
    got = compare_outputs("s", ref, cand, early_tokens=2)
    # 3 has an empty candidate output (the errors' business), 4 and 5 are on one side only
    assert (got.compared, got.exact, got.diverged) == (3, 1, 2)
    # request 2 parts at 0 (< 2: early); request 1 at 2 (not early)
    assert got.early == 1 and got.histogram[0] == 1 and got.histogram[2] == 1
    assert sum(got.histogram) == got.diverged and len(got.histogram) == HISTOGRAM_BINS
    assert got.basis == "token_ids" and got.median_position() == 0.0
    assert [e.request_id for e in got.examples] == [1, 2]
    assert sum(n for n, _ in got.blocks) == 3 and sum(e for _, e in got.blocks) == 1


def test_a_short_output_is_early_when_it_parts_before_its_own_end() -> None:
    # max_tokens 4 with early_tokens 16: a divergence at token 3 is inside the window
    got = compare_outputs("s", {0: ids(1, 2, 3, 4)}, {0: ids(1, 2, 3, 9)}, early_tokens=16)
    assert got.early == 1


def test_one_text_pair_makes_the_basis_text() -> None:
    ref = {0: ids(1, 2), 1: Output("ab", 2)}
    cand = {0: ids(1, 2), 1: Output("ab", 2)}
    assert compare_outputs("s", ref, cand, 16).basis == "text"


@given(st.integers(0, 3000))
def test_blocks_cover_every_pair_and_are_never_short(n: int) -> None:
    flags = [i % 3 == 0 for i in range(n)]
    got = block_counts(flags)
    assert sum(k for k, _ in got) == n and sum(e for _, e in got) == sum(flags)
    assert len(got) <= BLOCKS
    if n >= MIN_BLOCK:
        assert all(k >= MIN_BLOCK for k, _ in got)
        # blocks are equal but the last, which takes the remainder
        assert len({k for k, _ in got[:-1]}) <= 1 and got[-1][0] >= got[0][0]


# -- the rule -----------------------------------------------------------------------------


def outputs(flags: list[bool]) -> MirroredOutputs:
    n, e = len(flags), sum(flags)
    return MirroredOutputs("steady", n, n - e, e, 16, "token_ids", blocks=block_counts(flags))


def test_benign_divergence_passes_and_gross_divergence_holds() -> None:
    rng = np.random.default_rng(0)
    benign = outputs(list(rng.random(400) < 0.05))
    gross = outputs(list(rng.random(400) < 0.97))
    (b,) = mirrored_output_checks([benign], POLICY)
    (g,) = mirrored_output_checks([gross], POLICY)
    assert b.decision == "pass" and b.id == "steady.outputs.divergence"
    assert g.decision == "fail" and g.holds and "first tokens on" in g.message
    assert g.threshold == POLICY.divergence.gross_share and g.group == "correctness"


def test_too_few_pairs_are_inconclusive_not_a_hold() -> None:
    # 13 blocks of 16 cannot reach 0.001 even at a share of 1 (exp(-2 * 13 / 4) = 0.0015);
    # 14 can (exp(-7) = 0.0009).
    (c,) = mirrored_output_checks([outputs([True] * (13 * MIN_BLOCK))], POLICY)
    assert c.decision == "undecided" and not c.holds and "too few" in c.message
    (c,) = mirrored_output_checks([outputs([True] * (14 * MIN_BLOCK))], POLICY)
    assert c.decision == "fail"


def test_the_references_own_early_share_raises_the_threshold() -> None:
    # The reference parts early from itself in 60% of its correctness probes: x1.5 = 90%.
    assert gross_threshold(POLICY, 0.6) == pytest.approx(0.9)
    assert gross_threshold(POLICY, 0.01) == POLICY.divergence.gross_share
    assert gross_threshold(POLICY, 1.0) == 0.95
    flags = [i % 10 != 0 for i in range(2000)]  # 90% early
    (alone,) = mirrored_output_checks([outputs(flags)], POLICY)
    (own,) = mirrored_output_checks([outputs(flags)], POLICY, envelope_share=0.6)
    assert alone.decision == "fail" and not own.holds
    (some,) = mirrored_output_checks([outputs(flags)], POLICY, envelope_share=0.4)
    assert some.threshold == pytest.approx(0.6) and some.decision == "pass"


def test_hoeffding_bound() -> None:
    assert hoeffding_p([(10, 10)] * 16, 0.5) == pytest.approx(math.exp(-2 * 16 * 0.25))
    assert hoeffding_p([(10, 5)] * 16, 0.5) == 1.0
    assert hoeffding_p([], 0.5) == 1.0


def runs_of_early(rng: np.random.Generator, n: int, p: float, run: int) -> list[bool]:
    """Pairs that part in runs of `run` consecutive requests (a batch sharing its kernels'
    path), each run early with probability p: the share is p, the pairs are dependent."""
    starts = rng.random(n // run + 1) < p
    return list(np.repeat(starts, run)[:n])


@pytest.mark.parametrize(
    ("n", "run"), [(300, 1), (300, 8), (300, 16), (500, 16), (2000, 16), (2000, 32), (2000, 60)]
)
def test_the_rule_keeps_its_alpha_when_pairs_part_in_runs(n: int, run: int) -> None:
    """At the threshold itself (share = gross_share), the rule holds at most gross_alpha of the
    time when the pairs part in runs shorter than a block (16, or n/32 from 512 pairs on), where
    the naive binomial test on the pairs, which assumes them independent, passes its alpha by
    far once they part in runs."""
    dp = POLICY.divergence
    rng = np.random.default_rng(n * 31 + run)
    ours = naive = 0
    trials = 4000
    for _ in range(trials):
        flags = runs_of_early(rng, n, dp.gross_share, run)
        (c,) = mirrored_output_checks([outputs(flags)], POLICY)
        ours += c.decision == "fail"
        e = sum(flags)
        naive += float(binom.sf(e - 1, n, dp.gross_share)) <= dp.gross_alpha
    # 3 standard errors above alpha at this many trials
    bound = dp.gross_alpha + 3 * math.sqrt(dp.gross_alpha / trials)
    assert ours / trials <= bound
    if run >= 8:
        assert naive / trials > 10 * dp.gross_alpha  # why the test is on blocks


@pytest.mark.parametrize("n", [500, 1000, 2000])
def test_a_gross_bug_holds_in_every_run_even_in_runs(n: int) -> None:
    """Wrong tokens from the first positions in 97% of the prompts, parting in runs of 8:
    held in all of 500 scenarios from 500 pairs on (at 300 pairs, 18 blocks, about 90%)."""
    rng = np.random.default_rng(n)
    held = 0
    for _ in range(500):
        (c,) = mirrored_output_checks([outputs(runs_of_early(rng, n, 0.97, 8))], POLICY)
        held += c.decision == "fail"
    assert held == 500


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=0, max_size=600))
def test_the_check_is_consistent_with_its_counts(flags: list[bool]) -> None:
    o = outputs(flags)
    (c,) = mirrored_output_checks([o], POLICY)
    if len(flags) < 14 * MIN_BLOCK:
        assert c.decision == "undecided"
    else:
        assert c.decision in ("pass", "fail")
        # it never holds a scenario whose early share is at or below the threshold
        if sum(flags) / len(flags) <= POLICY.divergence.gross_share:
            assert c.decision == "pass"
    assert len(o.blocks) <= BLOCKS


@given(st.text(alphabet="abc", max_size=60), st.text(alphabet="abc", max_size=60))
def test_common_prefix_is_the_naive_one(x: str, y: str) -> None:
    naive = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
    assert common_prefix(x, y) == naive == common_prefix(list(x), list(y))


def test_a_prefix_parts_where_the_shorter_ends_and_is_never_early() -> None:
    """An earlier stop or a truncation: on token ids and on text alike, the pair parted (it is
    not exact) but not early, whichever side is the shorter."""
    long_ids, short_ids = ids(1, 2, 3, 4, 5), ids(1, 2)
    long_txt, short_txt = Output("abcdefghij", 5), Output("abcd", 2)
    for a, b in ((long_ids, short_ids), (short_ids, long_ids), (long_txt, short_txt)):
        got = compare_outputs("s", {0: a}, {0: b}, early_tokens=16)
        assert (got.exact, got.early) == (0, 0) and is_prefix(a, b)
    got = compare_outputs("s", {0: short_txt}, {0: long_txt}, early_tokens=16)
    assert (got.exact, got.early) == (0, 0)
