# Two commands for a newcomer: `make install`, then `make test`.
# On a CUDA runner with torch/triton/hypothesis/pytest/xdist preinstalled, `make test` needs no install.

PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
JOBS   ?= auto
# torch 2.13.0 is pinned for the CPU-only install: pip finds a local CPU build of it; a bare
# `torch` requirement would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install test lint throughput repro identify mutants sanitize bigcache sweep-fp32 bench

install:
	$(PYTHON) -m pip install "$(TORCH_CPU)" -e ".[dev]"

test:
	$(PYTEST) -n $(JOBS) -q $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .

# Replay a saved failure case: make repro CASE=failures/<file>.json [REPRO_ARGS="--impl ... -n 20"]
repro:
	@test -n "$(CASE)" || { echo "usage: make repro CASE=failures/<file>.json [REPRO_ARGS=...]"; exit 2; }
	$(PYTHON) -m tools.repro $(CASE) $(REPRO_ARGS)

# Which recipe does an implementation compute: make identify [IMPL=path/to/file.py:fn] [IDENTIFY_ARGS=--full]
identify:
	$(PYTHON) -m tools.identify $(IMPL) $(IDENTIFY_ARGS)

# Mutation testing (docs/mutants.md): make mutants [MUTANT_ARGS="--tier gpu -j 8 --budget 300 --only NAME"]
mutants:
	$(PYTHON) -m tools.mutants $(MUTANT_ARGS)

# GPU memory safety: the ci-sized properties under compute-sanitizer; any error (or a red test) fails.
# The caching allocator is off so that memcheck sees every allocation's true bounds.
SANITIZE_TESTS ?= conformance/test_bit_exact.py conformance/test_isolation.py
RACECHECK_TESTS ?= conformance/test_bit_exact.py
# Under memcheck a ci-profile test takes ~40 s on the H200 (4 tests in 170 s, 2026-12-02): budget ~15 min.
SANITIZE_TIMEOUT ?= 900
RACECHECK_TIMEOUT ?= 600
sanitize:
	@out=$${OUT:-reports}; mkdir -p $$out; \
	for tool in memcheck racecheck; do \
	  if [ $$tool = memcheck ]; then tests="$(SANITIZE_TESTS)"; prof=ci; t=$(SANITIZE_TIMEOUT); \
	  else tests="$(RACECHECK_TESTS)"; prof=dev; t=$(RACECHECK_TIMEOUT); fi; \
	  echo "== compute-sanitizer --tool $$tool on $$tests (profile $$prof), log $$out/sanitize-$$tool.log"; \
	  PYTORCH_NO_CUDA_MEMORY_CACHING=1 HYPOTHESIS_PROFILE=$$prof timeout $$t \
	    compute-sanitizer --tool $$tool --error-exitcode 99 --print-limit 50 \
	    $(PYTEST) -x -q -p no:cacheprovider $$tests > $$out/sanitize-$$tool.log 2>&1; rc=$$?; \
	  tail -n 25 $$out/sanitize-$$tool.log; \
	  if [ $$rc -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" $$out/sanitize-$$tool.log; then \
	    echo "SANITIZE FAILED: $$tool exit $$rc (124: timeout; 99: sanitizer errors; see $$out/sanitize-$$tool.log)"; \
	    exit 1; fi; \
	done; echo "SANITIZE PASSED: memcheck and racecheck report 0 errors"

# Caches above 2**31 bytes (CUDA only; skips elsewhere). Not under -n: each test holds ~9 GiB.
bigcache:
	$(PYTEST) -q -rs -p no:cacheprovider conformance/test_bigcache.py

# Every fp32 bit pattern through the kernel (CUDA): make sweep-fp32 [SWEEP_ARGS="--scales 1.0,0.3"]
sweep-fp32:
	$(PYTHON) -m tools.sweep_fp32 $(SWEEP_ARGS)

# Time the fused write on one CUDA GPU (CSV + PNG into $OUT or reports/): make bench [BENCH_ARGS=--quick]
bench:
	$(PYTHON) -m tools.bench $(BENCH_ARGS)

# Bit-exact examples per second after warm-up, and kernel variants compiled: make throughput [N=300]
N ?= 300
throughput:
	$(PYTHON) -m tools.throughput -n $(N)
