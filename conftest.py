"""Suite-wide setup: the backend (before triton is imported) and the Hypothesis profiles.

Profiles (choose with --hypothesis-profile=NAME or $HYPOTHESIS_PROFILE):
  dev       few examples, fast local iteration, with the example database (the default outside CI)
  ci        CPU CI under the interpreter: derandomized (so no database: Hypothesis forbids both),
            bounded to fit 15 minutes on 2 cores
  gpu       CUDA runners: many more examples, with the example database, so CI can upload it and a
            local run pointed at it replays CI's failures first. Hypothesis forbids derandomize with a
            database, so reproducibility comes from a fixed --hypothesis-seed (.github/workflows/gpu.yml)
  thorough  long exploratory runs, randomized, with the example database

The database is $KVFP8_HYPOTHESIS_DB, else .hypothesis/examples. Failure files (the shrunk Case as
JSON, conformance/artifacts.py) go to $KVFP8_FAILURES, else failures/; the run's summary lists them.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from conformance.database import example_database
from conformance.pinning import worker_gpu_env

os.environ.update(worker_gpu_env())  # xdist worker -> its GPU, before kernel starts CUDA (conformance/pinning.py)

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.impls import test_device

# conformance.session: --impl/--convention/--recipe, the implementations and recipes of the run, its
# header and fixtures; conformance.stats: examples/s per property and kernel variants compiled.
# conformance.pinning: the GPU each test ran on; conformance.database: examples keyed by node id;
# conformance.timeline: every process's tests in time, with $KVFP8_TIMELINE (tools/timeline.py)
pytest_plugins = ["conformance.session", "conformance.stats", "conformance.pinning", "conformance.database",
                  "conformance.timeline"]

DATABASE_DIR = os.environ.get("KVFP8_HYPOTHESIS_DB", ".hypothesis/examples")
DATABASE = example_database()  # DATABASE_DIR, and the shared databases of docs/database.md
_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, database=DATABASE, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **_common)
# gpu: the PR lane on a CUDA runner, within 2 minutes on an H200 (nearly every drawn layout compiles a kernel
# variant: docs/results/); the nightly lane runs `thorough`.
settings.register_profile("gpu", max_examples=100, database=DATABASE, **_common)
settings.register_profile("thorough", max_examples=3000, database=DATABASE, **_common)


def _default_profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    if test_device().type == "cuda":
        return "gpu"
    return "ci" if os.environ.get("CI") else "dev"


settings.load_profile(_default_profile())

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One xdist worker per core already fills the machine: torch's own intra-op threads on top of
    # that oversubscribe it and spin (measured: 16x the CPU time for the reference on 2 cores).
    torch.set_num_threads(1)


def _long_units(items: list) -> list[list]:
    """The tests marked long, as units that must run on one worker: each test alone, or a module's long
    tests together when its mark says `long("module")` (they share one module-scoped run)."""
    units: dict[object, list] = {}
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is not None:
            key = item.module if "module" in mark.args else item
            units.setdefault(key, []).append(item)
    return list(units.values())


def dist_mode(config: pytest.Config) -> str:
    """The run's xdist scheduler. A worker's own `config.option.dist` is always "no" (xdist sets it so), so
    there it is read from the controller's command line (xdist's default under -n is `load`); the H100's
    `make test` had placed the long tests for `load` and ran one of them alone for its last 19 s."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return getattr(config.option, "dist", "no")
    argv = list(workerinput.get("mainargv", []))
    for i, arg in enumerate(argv):
        if arg == "--dist" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--dist="):
            return arg.split("=", 1)[1]
    return "load"


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    # A test of tens of seconds must not run alone at the end (the H200 timeline of docs/bench.md), nor
    # behind the other long ones on one worker. xdist's `load` scheduler first sends each of its W
    # workers a chunk of (N // W) // 4 consecutive tests (pytest-xdist's LoadScheduling.schedule), and
    # "long first" put every long test in worker 0's chunk (222 s of a 279 s run on the H200,
    # docs/results/h200-2026-12-04-c.md); its `worksteal` scheduler (make test's) first gives each worker
    # N // W consecutive tests, and an idle worker then takes half of the longest queue left. So the long
    # units are dealt round-robin to the heads of the first chunks; the order is otherwise kept. Without
    # xdist, the long tests simply go first.
    units = _long_units(items)
    rest = [item for item in items if item.get_closest_marker("long") is None]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    share = 1 if dist_mode(config) == "worksteal" else 4
    chunk = (len(items) // workers) // share if workers else 0
    if chunk < 2:
        items[:] = [item for unit in units for item in unit] + rest
        return
    order: list = []
    for i in range(workers):
        head = [item for unit in units[i::workers] for item in unit]
        take = max(0, chunk - len(head))
        order += head + rest[:take]
        rest = rest[take:]
    items[:] = order + rest
