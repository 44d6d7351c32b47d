PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint docs screenshots bench mutate clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

# The deploy unit's settings (fastapi_lith/serving.py); `make run SERVER=granian` serves with granian.
SERVER ?= uvicorn
run: $(STAMP)
	KANBAN_DB=$${KANBAN_DB:-kanban.db} KANBAN_OPERATOR_PASSWORD=$${KANBAN_OPERATOR_PASSWORD:-dev} $(BIN)/python -m fastapi_lith serve examples.kanban.app:app --server $(SERVER) --log-config deploy/logging.json

# The suite runs in cores + 1 processes (pytest-xdist): most tests wait on a server, a
# subprocess or a page, so that takes under half the time of one. TEST_JOBS=0 runs it in this
# process alone (a debugger, -x on the first failure).
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_JOBS)

# The rules and types in pyproject.toml ([tool.ruff], [tool.mypy]); no formatter: the code is laid out by hand.
lint: $(STAMP)
	$(BIN)/ruff check fastapi_lith tests bench
	$(BIN)/mypy fastapi_lith

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# The dashboard's screenshots in the docs (docs/img), taken by its browser test.
screenshots: $(STAMP)
	LITH_SCREENSHOTS=1 $(BIN)/python -m pytest -q -n 0 tests/dashboard/test_dashboard_browser.py

# A quick pass of every benchmark (bench/RESULTS.md says what they measure): under ten minutes
# on two cores. `python -m bench.NAME --help` for one scenario's own flags, and --against REV.
BENCHES := writer hub encoders send kanban workers postgres accounts replica restart connects dashboard tabs memory
bench: $(STAMP)
	for name in $(BENCHES); do $(BIN)/python -m bench.$$name --quick || exit 1; done

# Mutation testing of the core (tests/MUTATION.md). MUTANTS narrows it to one module, e.g.
# `make mutate MUTANTS='fastapi_lith.engine.hub.*'`; `.venv/bin/mutmut browse` shows the survivors.
# Two mutants per core: many tests wait on threads and timers, and another mutant's tests fill
# that time.
MUTATE_JOBS ?= $(shell echo $$(( 2 * $$(nproc) )))
mutate: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf $(VENV) site .pytest_cache mutants
