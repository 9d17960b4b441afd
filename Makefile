# normfl. Every target creates .venv (and installs the package into it) when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# Paper figures and tables (see REPRODUCTION.md): make <id> [profile=paper|text|code|quick] [parallel=N] [stack=N]
# [launcher=slurm|joblib|submitit_local|stacked ARGS="hydra.launcher.partition=gpu ..."]
profile  ?= paper
parallel ?= 1
stack    ?=
launcher ?=
RUNOPTS   = --profile $(profile) --parallel $(parallel) $(if $(stack),--stack $(stack)) \
            $(if $(launcher),--launcher $(launcher))
IDS := normec-f1 normec-f2 normec-f3 normec-f4 normec-f5 normec-f6 normec-f7 \
       normec-f8 normec-f9 normec-t2 normec-f10 normec-f11 normec-f12 normec-f13 \
       fednormec-f1 fednormec-f2 fednormec-f3 fednormec-f4 fednormec-f5 alidpfl-t2 alidpfl-t3 \
       alidpfl-t4 alidpfl-f1 alidpfl-f6 normfedavg-t2 normfedavg-f1 normfedavg-t3 normfedavg-f2 \
       normfedavg-t4 normfedavg-f3 normfedavg-t5 normfedavg-f4 normfedavg-t6 normfedavg-f5
REPRODUCE := $(BIN)/python -m normfl.reproduce

.PHONY: install lock run test test-quick lint campaign verify bench gpu-check scale privacy-table audit clean figures report all-figures alidpfl-readings noise-readings $(IDS)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)          ## create .venv with the locked, tested environment (requirements.lock) and normfl in it

lock:                      ## re-resolve pyproject.toml's ranges in a fresh venv and pin the result in requirements.lock
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv && .lock-venv/bin/python -m pip install -q -e '.[dev]'
	(sed -n '1,2p' requirements.lock; .lock-venv/bin/python -m pip freeze --exclude-editable) > requirements.lock.tmp
	mv requirements.lock.tmp requirements.lock && rm -rf .lock-venv

NOW     := $(shell date +%Y-%m-%d_%H-%M-%S)
RUN_DIR ?= outputs/runs/make-run/$(NOW)
run: $(STAMP)              ## the main job: NORMEC's default setup, the paper's 300 passes on a GPU (make run ARGS="algo=dp_normec ...")
	$(BIN)/python scripts/main_job.py $(RUN_DIR) $(ARGS)

test: $(STAMP)             ## the test suite (real data slices from the offline copies, `offline_data`), two processes
	$(BIN)/python -m pytest -q -n 2 $(ARGS)

test-quick: $(STAMP)       ## the tests a developer runs while working: all but those marked slow, two processes (about a minute)
	$(BIN)/python -m pytest -q -n 2 -m "not slow" $(ARGS)

lint: $(STAMP)             ## ruff, and the layers of normfl (pyproject.toml's [tool.importlinter]: docs/architecture.md)
	$(BIN)/ruff check normfl tests scripts train.py
	$(BIN)/lint-imports

bench: $(STAMP)            ## round time of settings A-D against the compute floor and paper-style code
	$(BIN)/python scripts/bench.py $(ARGS)

gpu-check: $(STAMP)        ## on a GPU: the GPU tests, the suite's equality tests on CUDA, the bench of A (16 runs, in a row), a round's kernels, timed NORMEC passes -> outputs/gpu-check/report.md (B-D: ARGS="--parts bench-bcd")
	$(BIN)/python scripts/gpu_check.py $(ARGS)

scale: $(STAMP)            ## round time and peak memory at 1,000 / 10,000 / 100,000 clients
	$(BIN)/python scripts/scale.py $(ARGS)

privacy-table: $(STAMP)    ## regenerate docs/privacy-table.md from dp-accounting
	$(BIN)/python scripts/privacy_table.py > docs/privacy-table.md.tmp && mv docs/privacy-table.md.tmp docs/privacy-table.md

audit: $(STAMP)            ## audit every private algorithm with canaries, beside it and through its round (about 9 min on 2 cores): docs/audit.md
	$(BIN)/python scripts/audit.py > docs/audit.md.tmp && mv docs/audit.md.tmp docs/audit.md

$(IDS): $(STAMP)           ## train the missing runs of one figure/table's grid, then draw it
	$(REPRODUCE) run $@ $(RUNOPTS) $(ARGS)

all-figures: $(STAMP)      ## every figure/table's grid that has the profile (long: see REPRODUCTION.md for times)
	$(REPRODUCE) run $(RUNOPTS) $(ARGS)

figures: $(STAMP)          ## redraw from stored runs, no training: IDS="normfedavg-t3 ..." (default: every ID), each profile
	$(REPRODUCE) figures --all-profiles $(if $(filter command line,$(origin IDS)),$(IDS))

alidpfl-readings: $(STAMP) ## ALI-DPFL at R_c = 177: the paper's text vs the authors' code, setting by setting
	$(BIN)/python scripts/ali_readings.py run outputs/ali-readings --parallel $(parallel)
	$(BIN)/python scripts/ali_readings.py table outputs/ali-readings

noise-readings: $(STAMP)   ## DP-(Fed-)α-NormEC under each reading of the papers' noise: 30 passes on a GPU (profile=text: 300 steps, CPU)
	$(BIN)/python scripts/noise_readings.py run --profile $(profile) --parallel $(parallel) $(ARGS) \
	  > docs/reproduction/noise-readings-$(profile).md.tmp
	mv docs/reproduction/noise-readings-$(profile).md.tmp docs/reproduction/noise-readings-$(profile).md

budget ?= 25m
campaign: $(STAMP)         ## train the missing runs of IDS="..." (default: every ID) within budget=25m, record, archive
	$(REPRODUCE) campaign $(IDS) --profile $(profile) --budget $(budget) --parallel $(parallel) $(ARGS)

verify: $(STAMP)           ## train committed records again, KEYS="..." (record keys or IDs): identical, or how far
	$(REPRODUCE) verify $(KEYS) --profile $(profile) $(ARGS)

report: $(STAMP)           ## write REPRODUCTION.md from stored runs
	$(REPRODUCE) report

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
