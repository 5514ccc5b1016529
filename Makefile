# The README's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files: reinstall only when the project's dependencies change.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints-dev.txt
	$(PIP) install -q -c constraints-dev.txt -e ".[torch,cli]"
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints-dev.txt
	$(PIP) install -q -c constraints-dev.txt -e ".[dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/rankscope demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

# The HTML report is tested in a real browser: Debian's chromium, installed once.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

test: lint $(CHROMIUM)
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/capture_stall.py

clean:
	rm -rf $(VENV) runs
