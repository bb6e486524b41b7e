# The two commands of the README: `make demo` and `make test`; `make gpu` on a lent GPU.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Use the machine's local wheel directory when it has one (the CPU torch build).
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
PIP    := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt $(FIND_LINKS)

.PHONY: demo test lint bench gpu gpu-wheels clean

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

# Whoever is lent a GPU runs this first: tests/test_gpu.py and benchmarks/gpu_mfu.py
# within 8 minutes, into build/gpu/gpu-results.md (or $$GPU_OUT, else $$OUT). It needs
# no venv: the venv's python if there is one, else python3 (the one holding torch with
# CUDA); what that lacks comes from build/gpu-wheels, which `make gpu-wheels` fills where
# pip reaches PyPI (for a GPU machine that cannot).
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_PYTHON_VERSION ?= 3.12
gpu:
	$(GPU_PY) benchmarks/gpu_routine.py

gpu-wheels:
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
	  --python-version $(GPU_PYTHON_VERSION) --implementation cp --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d build/gpu-wheels -r benchmarks/gpu_wheels.txt

clean:
	rm -rf $(VENV) build dist
