# normfl. Every target creates .venv (and installs the package into it) when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install run test lint bench privacy-table clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)          ## create .venv and install normfl with its dev tools

run: $(STAMP)              ## the main job: NORMEC's default setup (make run ARGS="algo=dp_normec ...")
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)             ## the test suite (real data slices from ../shared/data)
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check normfl tests scripts train.py

bench: $(STAMP)            ## per-round client time of each backend (ratios), default setup
	$(BIN)/python scripts/bench_backends.py $(ARGS)

privacy-table: $(STAMP)    ## regenerate docs/privacy.md from dp-accounting
	$(BIN)/python scripts/privacy_table.py > docs/privacy.md.tmp && mv docs/privacy.md.tmp docs/privacy.md

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
