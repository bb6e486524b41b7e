# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Use the machine's local wheel directory when it has one (the CPU torch build).
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
PIP    := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt $(FIND_LINKS)

.PHONY: demo test lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e '.[dev]'
	touch $@

# Each test file runs on one worker (its module fixtures, such as the golden plans'
# training jobs, are built once); conftest.py hands out the longest files first.
test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# Lint the example plans, then compile the tiny CPU plan (dp2 × tp2 with
# sequence parallel) and train it on the bundled text with 4 gloo processes.
demo: $(VENV)/.installed
	$(VENV)/bin/dslc lint plans
	$(VENV)/bin/dslc compile plans/tiny_demo.plan -o $(VENV)/demo
	TORCHRUN=$(VENV)/bin/torchrun $(VENV)/demo/tiny_demo/launch.sh --log-every 20

lint: $(VENV)/.installed
	$(VENV)/bin/dslc lint plans
	$(VENV)/bin/dslc fmt --check plans clusters benchmarks/published
	$(VENV)/bin/ruff check dslc tests benchmarks

bench: $(VENV)/.installed
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist
