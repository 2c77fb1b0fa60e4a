# Two commands for a newcomer: `make install` (the suite, ruff, PyYAML and HypoFuzz), then `make test`.
# On a CUDA runner with torch/triton/hypothesis/pytest/xdist preinstalled, `make test` needs no install.

# `make install` makes a project virtual environment (.venv): Debian 12+, Ubuntu 23.04+ and Homebrew
# Pythons refuse a system-wide `pip install` (PEP 668). `make test` uses .venv when it exists, else
# python3 (a CUDA runner with the packages preinstalled needs no install).
VENV   ?= .venv
BOOTSTRAP_PYTHON ?= python3
PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
PYTEST ?= $(PYTHON) -m pytest
JOBS   ?= auto
# worksteal: an idle xdist worker takes half of the longest queue left, so no chunk of long tests runs
# alone at the end (conftest.py orders the long tests for it)
DIST   ?= worksteal
# torch 2.13.0 is pinned for the CPU-only install: pip finds a local CPU build of it; a bare
# `torch` requirement would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install test lint throughput repro identify mutants sanitize bigcache sweep-fp32 bench conformance conformance-diff fuzz

install:
	@$(BOOTSTRAP_PYTHON) -m venv $(VENV) || { \
	  echo "make install: '$(BOOTSTRAP_PYTHON) -m venv' failed. Install the venv module (Debian/Ubuntu:" \
	       "apt install python3-venv; Fedora: it is part of python3), or point BOOTSTRAP_PYTHON at a" \
	       "Python that has it, then run make install again." >&2; exit 1; }
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install "$(TORCH_CPU)" -e ".[dev,fuzz]"

test:
	$(PYTEST) -n $(JOBS) --dist $(DIST) -q $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .

# Replay a saved failure case: make repro CASE=failures/<file>.json [REPRO_ARGS="--impl ... -n 20"]
repro:
	@test -n "$(CASE)" || { echo "usage: make repro CASE=failures/<file>.json [REPRO_ARGS=...]"; exit 2; }
	$(PYTHON) -m tools.repro $(CASE) $(REPRO_ARGS)

# Which recipe does an implementation compute: make identify [IMPL=path/to/file.py:fn] [IDENTIFY_ARGS=--full]
identify:
	$(PYTHON) -m tools.identify $(IMPL) $(IDENTIFY_ARGS)

# Mutation testing (docs/mutants.md): make mutants [MUTANTS_ARGS="--tier gpu -j 8 --budget 300 --only NAME"]
MUTANTS_ARGS ?= $(MUTANT_ARGS)
mutants:
	$(PYTHON) -m tools.mutants $(MUTANTS_ARGS)

# GPU memory safety (tools/sanitize.py): ci-sized properties under compute-sanitizer memcheck and
# racecheck, instrumenting only the fused kernel; any error, or a red test, fails.
# make sanitize [SANITIZE_ARGS="--profile gpu --tool memcheck --timeout 900"]
sanitize:
	$(PYTHON) -m tools.sanitize $(SANITIZE_ARGS)

# Caches above 2**31 bytes (CUDA only: exits 2 elsewhere). Not under -n: each test holds ~9 GiB.
bigcache:
	@$(PYTHON) -c "import sys; from tools._cli import cuda_missing; sys.exit(cuda_missing('make bigcache', 'caches above 2**31 bytes'))"
	$(PYTEST) -q -rs -p no:cacheprovider conformance/test_bigcache.py

# Every fp32 bit pattern through the kernel (CUDA): make sweep-fp32 [SWEEP_FP32_ARGS="--scales 1.0,0.3"]
SWEEP_FP32_ARGS ?= $(SWEEP_ARGS)
sweep-fp32:
	$(PYTHON) -m tools.sweep_fp32 $(SWEEP_FP32_ARGS)

# Time the fused write on one CUDA GPU (CSV + PNG into $OUT or reports/): make bench [BENCH_ARGS=--quick]
bench:
	$(PYTHON) -m tools.bench $(BENCH_ARGS)

# Bit-exact examples per second after warm-up, and kernel variants compiled: make throughput [EXAMPLES=300]
# Every target's extra options are <TARGET>_ARGS (the old MUTANT_ARGS, SWEEP_ARGS and N still work).
EXAMPLES ?= $(or $(N),300)
THROUGHPUT_ARGS ?=
throughput:
	$(PYTHON) -m tools.throughput --examples $(EXAMPLES) $(THROUGHPUT_ARGS)

# A conformance report for any implementation (docs/conformance.md): capability table and defects as
# reports/conformance/<name>.md and .json (into $OUT when set); exit 0 only when there is no defect.
# make conformance IMPL=path/to/file.py:fn [CONVENTION=sglang|vllm|kvfp8] [RECIPE=auto|NAME]
#                  [ENCODER=hardware|software] [CONFORMANCE_ARGS="--families ... --examples N"]
conformance:
	@test -n "$(IMPL)" || { echo "usage: make conformance IMPL=path/to/file.py:fn [CONVENTION=...] [RECIPE=auto|NAME] [ENCODER=...]"; exit 2; }
	$(PYTHON) -m tools.conformance $(IMPL) $(if $(CONVENTION),--convention $(CONVENTION)) $(if $(RECIPE),--recipe $(RECIPE)) $(if $(ENCODER),--encoder $(ENCODER)) $(CONFORMANCE_ARGS)

# What got worse (exit 1) or better between two JSON reports: make conformance-diff OLD=a.json NEW=b.json
conformance-diff:
	@test -n "$(OLD)" -a -n "$(NEW)" || { echo "usage: make conformance-diff OLD=old.json NEW=new.json"; exit 2; }
	$(PYTHON) -m tools.conformance_diff $(OLD) $(NEW)

# HypoFuzz campaign over every property (tools/fuzz.py, docs/fuzz.md): one process per GPU, pinned to it, else one
# per core; the project's example database. make fuzz [FUZZ_ARGS="--minutes 60 -n 4 --dashboard conformance/x.py"]
fuzz:
	$(PYTHON) -m tools.fuzz $(FUZZ_ARGS)
