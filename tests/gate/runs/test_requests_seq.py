"""The lazily built request sequences of a scenario and of its extension."""

from __future__ import annotations

import pytest

from gate.runs.schedules import Chained, LazyRequests
from gate.spec import ScenarioSpec, parse_spec


def scenario(prompt_tokens: int = 16) -> ScenarioSpec:
    spec = parse_spec(
        {
            "name": "t",
            "model": "m",
            "reference": {"url": "http://127.0.0.1:1"},
            "candidate": {"url": "http://127.0.0.1:2"},
            "scenarios": [
                {"name": "s", "rate": 10, "requests": 10, "prompt_tokens": prompt_tokens}
            ],
        }
    )
    return spec.scenarios[0]


def test_lazy_requests_are_reproducible_by_seed_and_index() -> None:
    sc = scenario()
    a, b = LazyRequests(sc, seed=3, length=600), LazyRequests(sc, seed=3, length=600)
    assert [r.prompt for r in a[250:260]] == [b[i].prompt for i in range(250, 260)]
    assert a[-1].request_id == 599 and a[-1] == a[599]
    assert list(a)[300] == a[300]
    other = LazyRequests(sc, seed=4, length=600)
    assert a[0].prompt != other[0].prompt
    with pytest.raises(IndexError):
        a[600]


def test_an_extension_is_numbered_on_from_the_schedule() -> None:
    sc = scenario()
    first = LazyRequests(sc, seed=1, length=5)
    then = LazyRequests(sc, seed=2, length=3)
    chained = Chained(first, then)
    assert len(chained) == 8
    assert [r.request_id for r in chained] == list(range(8))
    assert chained[4] == first[4]
    assert chained[5].prompt == then[0].prompt and chained[5].request_id == 5
    assert [r.request_id for r in chained[3:7]] == [3, 4, 5, 6]
    assert chained[-1].request_id == 7
    with pytest.raises(IndexError):
        chained[8]
    with pytest.raises(IndexError):
        chained[-9]
