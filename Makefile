# Two commands do everything: `make pretrain` and `make test`.
# On a cluster with its own environment (environment.yml), pass PYTHON=python to use it.

VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
PYTEST_ARGS ?=

ifeq ($(origin PYTHON), undefined)
PYTHON := $(VENV)/bin/python
ENV := $(VENV)/.installed
endif

.PHONY: pretrain test test-fast lint format status env clean

pretrain: $(ENV)
	$(PYTHON) -m pipeline $(ARGS)

status: $(ENV)
	$(PYTHON) -m pipeline.status $(ARGS)

# every tier but the GPU tests; the time of each tier is printed at the end
test: $(ENV)
	$(PYTHON) -m pytest $(PYTEST_ARGS)

# the fast tier, before each commit: no torch, no subprocess pipelines (about a minute)
test-fast: $(ENV)
	$(PYTHON) -m pytest -m unit $(PYTEST_ARGS)

lint: $(ENV)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format: $(ENV)
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

env: $(ENV)

# The virtual environment, rebuilt when the dependencies change. torch comes first, pinned, so
# that no other requirement pulls a different (multi-GB CUDA) build on a CPU machine.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e '.[dev,eval]'
	touch $@

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
