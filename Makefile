# The README's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test test-gpu test-frameworks lint bench clean

$(BIN)/python:
	@echo "==> creating the virtual environment $(VENV) (once, about 15 s)"
	$(PYTHON) -m venv $(VENV)

# Stamp files: reinstall only when the project's dependencies change. pip's own output
# stays (no -q): a first install takes a minute or more, and a silent minute looks hung.
# Without a terminal (CI) pip writes plain lines, a few per package: no redraws, no colour.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints-dev.txt
	@echo "==> installing rankscope, torch and the CLI's packages into $(VENV)"
	@echo "    the first time about a minute; pip is silent while it unpacks torch, the last half"
	$(PIP) install -c constraints-dev.txt -e ".[torch,cli]"
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints-dev.txt
	@echo "==> installing rankscope's development packages into $(VENV): torch, the" \
		"integrations' frameworks (transformers, lightning, ray), pytest, ruff, mypy"
	@echo "    the first time a few minutes; pip is silent while it unpacks the largest ones"
	$(PIP) install -c constraints-dev.txt -e ".[dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/rankscope demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

# The HTML report is tested in a real browser: Debian's chromium, installed once.
# apt-get needs root: as another user it goes through sudo, where there is one.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)
$(CHROMIUM):
	@echo "==> installing chromium with apt-get for the HTML report's tests (once, a minute or two)"
	@if [ "$$(id -u)" != 0 ] && [ -z "$(SUDO)" ]; then \
		echo "make test: installing chromium needs root (apt-get) and there is no sudo:" \
			"run 'apt-get install chromium' as root once, then make test again" >&2; exit 2; fi
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null

# The tests on parallel workers (pytest-xdist, one per core with -n auto). Each file runs
# whole on one worker (--dist loadfile), so a run that several of its tests read (a
# module-scoped fixture: spawned gloo ranks, Ray, chromium) is made once. Not loadgroup:
# xdist 3.8 writes the group into Item._nodeid, which pytest 9 no longer reads, and the
# groups are silently ignored. TEST_WORKERS=0 runs the tests in one process.
# The serial tests run alone after them, collected from the files that mark any (found
# by grep: collecting every file again costs 14 s of imports, lightning's alone 4 s).
TEST_WORKERS ?= auto
SERIAL_FILES = $(shell grep -rl "pytest.mark.serial" tests --include="test_*.py")
# Both parts run whatever the first one gave; make fails at the end if either failed.
test: lint $(CHROMIUM)
	@failed=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial" || failed=1; \
	echo "==> the serial tests, alone"; \
	$(BIN)/python -m pytest -q -p no:xdist -m serial $(SERIAL_FILES) || failed=1; \
	if [ $$failed -ne 0 ]; then echo "==> make test: some tests failed (above)"; fi; \
	exit $$failed

# On a machine with an NVIDIA GPU: the gpu-marked tests (they skip without CUDA; one that
# needs an optional package, DuckDB or Ray, skips with its name), then the timer's, the
# health sampler's and the capture's benchmarks on the device. They run on .venv's python
# where it is built, else on the host's own python3 from src/: a GPU host has its CUDA
# torch already, and reaches no package index to build .venv from.
GPU_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,PYTHONPATH=src $(PYTHON))
test-gpu:
	$(GPU_PY) -m pytest -q -p no:xdist -p no:cacheprovider -m gpu
	$(GPU_PY) bench/timer_overhead.py --device cuda --quick
	$(GPU_PY) bench/health_overhead.py --quick
	$(GPU_PY) bench/capture_stall.py --device cuda --quick

# The frameworks rankscope plugs into whose packages are too heavy for `make test`
# (ms-swift: 2 GB, about 5 minutes to install; verl: 1.9 GB with Ray, 2-3 minutes; SkyRL
# without its CUDA extra: 18 MB beside them) or
# pin what the dev environment cannot (ms-swift 4.6: transformers < 5.20; verl 0.9.1:
# < 5.11): their own environment, their tests run there.
FW_VENV := .venv-frameworks
$(FW_VENV)/.installed: pyproject.toml constraints-frameworks.txt
	@echo "==> installing the frameworks (ms-swift, verl, SkyRL, lmms-engine) into $(FW_VENV): the first time about 10 minutes"
	$(PYTHON) -m venv $(FW_VENV)
	$(FW_VENV)/bin/python -m pip install -c constraints-frameworks.txt -e ".[cli,ms-swift,verl,skyrl,lmms-engine]" pytest
	touch $@

test-frameworks: $(FW_VENV)/.installed
	$(FW_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_ms_swift.py tests/integrations/test_slime.py tests/integrations/test_verl.py tests/integrations/test_skyrl.py tests/integrations/test_lmms_engine_trainer.py

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/capture_stall.py

clean:
	rm -rf $(VENV) $(FW_VENV) runs
