# Two commands do all the setup on a fresh machine with Python 3.11+ and make:
#   make demo   creates .venv, installs the project, runs a full gate on two local sim engines
#   make test   same setup, then lint, type-check and the whole test suite
# and a developer's fast loop:
#   make check  lint, type-check and the pure cores' tests (the `core` tier), about a minute
# and one more starts the service locally (README, "Try the service on this machine"):
#   make serve  gate serve on http://127.0.0.1:8080 with the dev profile
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo demo-clean serve check test lint fmt clean vllm readme-verdict

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gate demo

demo-clean: $(STAMP)
	$(BIN)/gate demo --clean

# README.md's verdict example, written again from a run of `gate demo` (between its
# <!-- verdict:start/end --> markers); tests/docs/test_readme_verdict.py fails when it is stale.
readme-verdict: $(STAMP)
	$(BIN)/python tests/support/readme_verdict.py --write

# The dev profile: the service's closed defaults (tokens required, no caller argv, no caller
# URLs) plus the example named specs and engine templates (examples/specs, its engines/), the
# embedded SQLite, reports and engine logs under .gate/, the example inventory. A GATE_*
# variable already in the environment wins; SERVE_PORT picks the port (and the public URL).
SERVE_PORT ?= 8080

serve: $(STAMP)
	GATE_SPEC_DIR="$${GATE_SPEC_DIR:-examples/specs}" \
	GATE_PUBLIC_URL="$${GATE_PUBLIC_URL:-http://127.0.0.1:$(SERVE_PORT)}" \
	exec $(BIN)/gate serve --port $(SERVE_PORT)

# The fast tier: the tests tests/conftest.py marks `core` (the judge, the verdict, the spec and
# the architecture rules: no process, socket or service), in two workers.
check: lint
	$(BIN)/pytest -n 2 -q -m core

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite in three runs, in the order that packs two cores best (where the time goes: the
# 25 slowest tests of each run are printed; docs/architecture.md, "Tests"):
# 1. most tests in parallel workers (pytest-xdist: the gates they run mostly wait on engine
#    processes, so three workers on two cores cut the wall time), at a lower CPU priority, and
#    beside them the real-vLLM tests (marked `vllm`), one at a time at normal priority: the
#    vLLM servers get the cores when they need them and the parallel run the rest. Their
#    output is kept in .pytest-vllm.log and printed after the parallel run's;
# 2. the whole sim gates whose asserted verdict rests on timing (marked `timed_gate`), three
#    at a time: each mostly waits on its sim engines, but a busy parallel run would blur them;
# 3. alone, the tests marked `serial` (clocks checked to the millisecond, the orphan sweep).
# Every run always runs; the target fails if any failed. `pytest` by itself still runs
# everything, serially.
TEST_WORKERS ?= 3
VLLM_LOG := .pytest-vllm.log

test: lint
	@rc=0; \
	echo "== real-vLLM tests: running beside the parallel run, output in $(VLLM_LOG)"; \
	$(BIN)/pytest -p no:xdist --durations=10 -m vllm > $(VLLM_LOG) 2>&1 & vllm=$$!; \
	nice -n 10 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 \
	  -m "not serial and not vllm and not timed_gate" || rc=$$?; \
	echo "== real-vLLM tests: waiting for them"; \
	wait $$vllm || rc=$$?; \
	cat $(VLLM_LOG); \
	$(BIN)/pytest -n 3 --durations=25 -m "timed_gate and not vllm" || rc=$$?; \
	$(BIN)/pytest -p no:xdist --durations=25 -m "serial and not vllm and not timed_gate" || rc=$$?; \
	exit $$rc

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The real-vLLM test bed (vLLM's CPU build in .vllm/venv, tiny models made here): idempotent.
vllm:
	bench/vllm/setup

clean:
	rm -rf $(VENV) .gate .pytest_cache .mypy_cache .ruff_cache
