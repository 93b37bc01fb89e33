"""The per-check series' labels stay bounded (gate/service/series.py): spec names sanitised
and capped at the most-used MAX_SPEC_LABELS (the rest `other`), check names the judge's
vocabulary without the spec's scenario names, and at most MAX_CHECK_LABELS of them."""

from __future__ import annotations

from gate.service.series import (
    MAX_CHECK_LABELS,
    MAX_LABEL_CHARS,
    MAX_SPEC_LABELS,
    OTHER,
    Labels,
    check_kind,
    sanitise,
    top_specs,
)


def test_spec_names_are_sanitised_and_capped() -> None:
    assert sanitise('we"ird{name}\n') == "we_ird_name__"
    assert len(sanitise("x" * 500)) == MAX_LABEL_CHARS
    finished = [(f"spec-{i}", "continue", False, 100 - i) for i in range(MAX_SPEC_LABELS + 15)]
    labels = Labels(top_specs(finished))
    assert labels.spec("spec-0") == "spec-0"
    assert labels.spec(f"spec-{MAX_SPEC_LABELS - 1}") == f"spec-{MAX_SPEC_LABELS - 1}"
    assert labels.spec(f"spec-{MAX_SPEC_LABELS}") == OTHER  # the 21st most used
    assert len({labels.spec(n) for n, *_ in finished}) == MAX_SPEC_LABELS + 1


def test_check_names_drop_the_scenario_and_stay_few() -> None:
    assert check_kind("my-long-scenario.ttft.p50", "my-long-scenario") == "ttft.p50"
    assert check_kind("startup.phase.weights_loaded", None) == "startup.phase.weights_loaded"
    assert check_kind("compat.capability.chat", None) == "compat.capability.chat"
    assert check_kind("Weird Check!", None) == OTHER
    labels = Labels(set())
    kinds = {labels.check(f"startup.phase.p{i}", None) for i in range(MAX_CHECK_LABELS + 50)}
    assert OTHER in kinds and len(kinds) == MAX_CHECK_LABELS + 1
    assert labels.check("startup.phase.p0", None) == "startup.phase.p0"  # already known
