# Two commands do all the setup on a fresh machine with Python 3.11+ and make:
#   make demo   creates .venv, installs the project, runs a full gate on two local sim engines
#   make test   same setup, then lint, type-check and the whole test suite
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo demo-clean test lint fmt clean vllm

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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The real-vLLM test bed (vLLM's CPU build in .vllm/venv, tiny models made here): idempotent.
vllm:
	bench/vllm/setup

clean:
	rm -rf $(VENV) .gate .pytest_cache .mypy_cache .ruff_cache
