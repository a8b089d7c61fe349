# django-bucketry developer tasks. `make demo` and `make test` are the two set-up commands.
#
# Everything runs from the virtualenv in .venv, installed in two steps each re-run only when
# pyproject.toml changes: `make demo` installs what the demo runs (the extras and the `demo`
# group), `make venv` (run by `make test`) adds the development tools (the `dev` group) to the
# same .venv. It holds the oldest versions we claim (Python 3.11, whose newest Django is the
# 5.2 LTS); `make test` also runs the suite in $(NEWEST_VENV), on Python 3.13 with the newest
# Django the requirement allows (see NEWEST_* below). `make servers` installs memcached, Redis,
# PostgreSQL and Chromium from Debian when they are missing (root only) and runs before the
# venv exists.

PYTHON3 ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PY      := $(BIN)/python
STAMP   := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
# The public extras, which the demo runs (with the servers its variables name); the tools
# (pytest, ruff, sphinx...) are pyproject's dependency group `dev` (PEP 735), which includes
# the `demo` group; pip installs groups from 25.1 on with --group.
EXTRAS  := memcached,redis,celery,drf
GROUP   := dev
DEMO_GROUP := demo

# The newest-versions leg. uv makes the venv from a python$(NEWEST_PYTHON) that runs (on PATH
# or among pyenv's versions), else from its own build of CPython, downloaded once: a fresh
# CI machine has only python3 and make. NEWEST_PYTHON_BIN=/path/to/python3.13 forces one.
NEWEST_PYTHON     ?= 3.13
NEWEST_PYTHON_BIN ?=
NEWEST_VENV       ?= .venv-newest
NEWEST_STAMP      := $(NEWEST_VENV)/.installed
# What it runs: everything but the several-process reliability runs and the browser tests,
# which stay on the oldest leg (and keep CI under 15 minutes); docs/index.rst says so.
# Not the tests of make itself (the demo's own venv, the PostgreSQL leg's selection): they
# run no code of the newest interpreter's or Django's, and the first leg runs them.
NEWEST_PYTEST     := -m 'not slow' --ignore=tests/reliability --ignore=tests/admin \
  --deselect tests/demo/test_make_demo.py::test_start_use_stop_and_start_again \
  --deselect tests/ratelimit/test_settings_effects.py::test_the_postgres_leg_selects_a_meaningful_number_of_tests

# CI=true turns "server binary missing" from a skip into a failure (tests/conftest.py).
export CI

.DEFAULT_GOAL := help
.PHONY: help venv venv-demo venv-newest servers lint test test-newest docs bench demo clean distclean fuzz

help:
	@echo "make demo       run the demo site on http://127.0.0.1:8000/ (PORT=8001 make demo to change)"
	@echo "make test       lint, pytest on SQLite, db_matrix tests on PostgreSQL, the suite on"
	@echo "                Python $(NEWEST_PYTHON) + the newest Django (test-newest), docs build"
	@echo "make venv       .venv with the tools (pip install -e '.[$(EXTRAS)]' --group $(GROUP))"
	@echo "make venv-demo  .venv with only what the demo runs (--group $(DEMO_GROUP) instead)"
	@echo "make test-newest  the suite in $(NEWEST_VENV): Python $(NEWEST_PYTHON), newest Django"
	@echo "make servers    install missing memcached/redis-server/postgresql/chromium/wrk/valgrind (root)"
	@echo "make lint       ruff check, ruff format --check, mypy"
	@echo "make docs       sphinx-build -W into docs/_build/html"
	@echo "make bench      python -m bench"
	@echo "make fuzz       every counter backend against the model, long run (BUCKETRY_FUZZ=1)"
	@echo "make clean      remove build, cache and demo files (distclean: also .venv)"

venv: $(STAMP)

venv-demo: $(DEMO_STAMP)

# pip install -e '.[$(EXTRAS)]' --group <group>, with a pip that knows --group.
define install_group
	@echo "==> installing django-bucketry[$(EXTRAS)] and the $(1) group into $(VENV)"
	$(PY) -m pip install --quiet --upgrade 'pip>=25.1'
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]' --group $(1)
endef

# Order-only on the interpreter: re-creating it must not by itself trigger a re-install,
# only a newer pyproject.toml does. The dev group includes the demo's, so its install
# stamps both.
$(STAMP): pyproject.toml | $(PY)
	$(call install_group,$(GROUP))
	@touch $@ $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(call install_group,$(DEMO_GROUP))
	@touch $@

venv-newest: $(NEWEST_STAMP)

# A fresh venv each time pyproject.toml changes, so the resolver picks the newest Django the
# requirement allows (no old install to keep). uv comes from the dev group.
$(NEWEST_STAMP): pyproject.toml | $(STAMP)
	@echo "==> creating $(NEWEST_VENV): Python $(NEWEST_PYTHON), the newest Django allowed"
	@rm -rf $(NEWEST_VENV)
	@set -e; interpreter=""; \
	for candidate in $(NEWEST_PYTHON_BIN) "$$(command -v python$(NEWEST_PYTHON) || true)" \
	    "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/$(NEWEST_PYTHON).*/bin/python$(NEWEST_PYTHON); do \
	  if [ -x "$$candidate" ] && "$$candidate" -c 'import sys; \
	      sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' \
	      $(NEWEST_PYTHON) 2>/dev/null; then interpreter=$$candidate; break; fi; \
	done; \
	if [ -z "$$interpreter" ]; then \
	  echo "==> no python$(NEWEST_PYTHON) here: uv's own build (downloaded once)"; \
	  export UV_PYTHON_PREFERENCE=only-managed; interpreter=$(NEWEST_PYTHON); \
	fi; \
	$(BIN)/uv venv --quiet --python "$$interpreter" $(NEWEST_VENV)
	$(BIN)/uv pip install --quiet --python $(NEWEST_VENV)/bin/python \
	  -e '.[$(EXTRAS)]' --group $(GROUP)
	@$(NEWEST_VENV)/bin/python -c 'import django, sys; \
	  print(f"    Python {sys.version.split()[0]}, Django {django.get_version()}")'
	@touch $@

$(PY):
	@echo "==> creating $(VENV) with $(PYTHON3)"
	@if ! $(PYTHON3) -m venv $(VENV); then \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==> '$(PYTHON3) -m venv' failed (no ensurepip?): installing Debian package python3-venv"; \
	    apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv && \
	    $(PYTHON3) -m venv $(VENV) || exit 1; \
	  else \
	    echo "error: '$(PYTHON3) -m venv' failed: install the Debian package python3-venv" \
	         "(sudo apt-get install python3-venv) and run make again" >&2; \
	    exit 1; \
	  fi; \
	fi

# Standard library only, so it works on a fresh machine before the venv exists.
servers:
	@$(PYTHON3) -m tests.servers --ensure

# Run every step even when an earlier one fails, so one run shows every problem; the summary
# names the failed steps and the exit status is non-zero if any failed. Each step says how
# long it took: CI's whole `make test` should stay under 15 minutes.
# The steps call make through SUBMAKE, not $(MAKE) itself: make runs every recipe line that
# names $(MAKE) even under `make -n`, and here that line is the whole test run.
SUBMAKE = $(MAKE) --no-print-directory
STEPS_BEGIN := failed=""; \
	step() { name=$$1; shift; printf '\n==> %s\n' "$$name"; start=$$(date +%s); \
	  "$$@" || failed="$$failed $$name"; \
	  printf '==> %s took %ss\n' "$$name" $$(($$(date +%s) - start)); }
STEPS_END = if [ -n "$$failed" ]; then printf '\nmake $@: FAILED:%s\n' "$$failed"; exit 1; fi; \
	printf '\nmake $@: all steps passed\n'

lint: venv
	@$(STEPS_BEGIN); \
	step ruff-check $(BIN)/ruff check --output-format=concise .; \
	step ruff-format $(BIN)/ruff format --check .; \
	step mypy $(BIN)/mypy; \
	$(STEPS_END)

# The PostgreSQL leg runs the tests marked db_matrix; pytest's exit 5 (nothing collected) fails
# it, so losing the markers cannot turn it green with nothing run.
#
# Lint, the docs build, the PostgreSQL leg (a short one, on servers of its own), the tests
# that count instructions under valgrind (`callgrind`: no timing, so sharing the machine
# cannot change what they see) and, once .venv-newest is made, the newest leg run beside the
# SQLite leg, on the machine's second core, their output kept and printed after it (the
# newest leg beside it took CI from 21 minutes to about 15 on two cores); each is still a
# step of its own, with its exit status. Every test server is started per run on free ports,
# and the one build in the tree (the sdist, tests/packaging) is taken under a lock.
test: venv servers
	@$(STEPS_BEGIN); \
	logs=$$(mktemp -d); \
	$(SUBMAKE) lint > $$logs/lint 2>&1 & lint=$$!; \
	$(SUBMAKE) docs > $$logs/docs 2>&1 & docs=$$!; \
	{ $(SUBMAKE) venv-newest > $$logs/venv-newest 2>&1; echo $$? > $$logs/venv-newest.rc; \
	  [ "$$(cat $$logs/venv-newest.rc)" = 0 ] && $(SUBMAKE) test-newest > $$logs/newest 2>&1; \
	} & newest=$$!; \
	$(BIN)/pytest -m db_matrix --db=postgres > $$logs/postgres 2>&1 & postgres=$$!; \
	$(BIN)/pytest -m callgrind > $$logs/callgrind 2>&1 & callgrind=$$!; \
	joined() { wait $$1; status=$$?; cat $$2; return $$status; }; \
	newest_made() { wait $$newest; echo $$? > $$logs/newest.rc; cat $$logs/venv-newest; \
	  return $$(cat $$logs/venv-newest.rc); }; \
	newest_ran() { cat $$logs/newest 2>/dev/null || echo "not run: .venv-newest was not made"; \
	  return $$(cat $$logs/newest.rc); }; \
	step pytest-sqlite $(BIN)/pytest -m 'not callgrind'; \
	step pytest-callgrind joined $$callgrind $$logs/callgrind; \
	step lint joined $$lint $$logs/lint; \
	step docs joined $$docs $$logs/docs; \
	step pytest-postgres joined $$postgres $$logs/postgres; \
	step venv-newest newest_made; \
	step pytest-newest newest_ran; \
	rm -rf $$logs; \
	$(STEPS_END)

test-newest: venv-newest servers
	$(NEWEST_VENV)/bin/pytest $(NEWEST_PYTEST)

docs: venv
	@echo "==> sphinx-build -W docs"
	@$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs built: docs/_build/html/index.html"

bench: venv servers
	$(PY) -m bench

# The long run of the state machine in tests/ratelimit/test_model.py: fresh random examples
# (the normal suite runs a short derandomized one), with hypothesis's example database so a
# failure found is tried first next time. BUCKETRY_FUZZ_EXAMPLES=N: examples per backend.
fuzz: venv servers
	BUCKETRY_FUZZ=1 $(BIN)/pytest tests/ratelimit/test_model.py

# Migrate, seed and create the superuser when needed, then run the web server and a Celery
# worker with beat until Ctrl-C (demo_site/run.py; DATABASE_URL, MEMCACHED_SERVERS, REDIS_URL
# switch to real servers, see docs/demo.rst). It installs only what the demo runs.
demo: venv-demo
	@$(PY) -m demo_site.run --port "$${PORT:-8000}"

clean:
	rm -rf docs/_build var .demo build dist *.egg-info tests/artifacts \
	       .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . \( -path ./$(VENV) -o -path ./$(NEWEST_VENV) \) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(NEWEST_VENV)
