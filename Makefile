# Two commands for a newcomer: `make install`, then `make test`.
# On a CUDA runner with torch/triton/hypothesis/pytest/xdist preinstalled, `make test` needs no install.

PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
JOBS   ?= auto
# torch 2.13.0 is pinned for the CPU-only install: pip finds a local CPU build of it; a bare
# `torch` requirement would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install test lint

install:
	$(PYTHON) -m pip install "$(TORCH_CPU)" -e ".[dev]"

test:
	$(PYTEST) -n $(JOBS) -q

lint:
	$(PYTHON) -m ruff check .
