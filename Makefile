# Claw-R1: `make run` serves the app on embedded defaults; `make test` runs the test suite.
# Both create .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# verl and what it imports on CPU (tests/integrations/), without verl's own requirements, which
# pull a CUDA torch and vLLM; pyproject.toml lists them too.
VERL_NO_DEPS := verl==0.9.1 tensordict==0.10.0 ray==2.60.0 omegaconf==2.4.0 codetiming==1.4.0 \
	pyvers==0.2.3 cloudpickle==3.1.3 protobuf==7.36.2

.PHONY: install install-test run test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml Makefile | $(PY)
	$(PIP) install -q -e '.[test,dev]'
	$(PIP) install -q --no-deps $(VERL_NO_DEPS)
# TRL for tests/client/test_trl_train.py (CI's SQLite pass); pinned: keeps the CPU torch.
	$(PIP) install -q 'trl==1.16.0' 'accelerate==1.15.0'
	@bash .ci/ensure-chromium
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed

# serve exits 0 on Ctrl-C (SIGINT) and SIGTERM, so make reports no error; SERVE_ARGS passes
# options through (e.g. `--fd N`: serve on an inherited socket, as the tests do). The demo's toy
# tokenizer (CLAW_TOKENIZER=demo) decodes token ids on the pages unless CLAW_TOKENIZER is set
# (exported by make, not by a shell around serve: a shell would turn Ctrl-C into make's Error).
run: export CLAW_TOKENIZER ?= demo
run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py bootstrap
	$(PY) manage.py serve $(SERVE_ARGS)

# The suite runs on TEST_WORKERS processes (pytest-xdist; default: one per core), each test
# file whole on one worker so its module-scoped servers start once, the longest files first
# (tests/durations.py: `--no-loadscope-reorder` keeps that order); TEST_WORKERS=0 runs it in
# this process.
# First the bytecode of the project's packages (every top-level folder with an __init__.py),
# written once: the suite starts hundreds of interpreters (live servers, their manage processes,
# benches) and, where PYTHONDONTWRITEBYTECODE is set, each would compile every module it imports
# from source. Speed only: a file that does not compile is named here and failed by pytest.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PY_PACKAGES  := $(patsubst %/__init__.py,%,$(wildcard */__init__.py))
test: $(VENV)/.installed-test
	-$(PY) -m compileall -q -j 0 $(PY_PACKAGES)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) var staticfiles
