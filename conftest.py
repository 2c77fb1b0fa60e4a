"""Suite-wide setup: the backend (before triton is imported), Hypothesis profiles, --impl/--recipe.

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
import time

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.artifacts import failures_dir
from conformance.impls import IMPL_ENV, selected_implementations, test_device
from kernel import RECIPES
from kernel.backend import describe

pytest_plugins = ["conformance.stats"]  # examples/s per property and kernel variants compiled

DATABASE_DIR = os.environ.get("KVFP8_HYPOTHESIS_DB", ".hypothesis/examples")
DATABASE = DirectoryBasedExampleDatabase(DATABASE_DIR)
_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, database=DATABASE, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **_common)
settings.register_profile("gpu", max_examples=150, database=DATABASE, **_common)
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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", default=None,
                     help="module:function or path/to/file.py:function to test instead of the fused kernel "
                          "(also $KVFP8_IMPL)")
    parser.addoption("--recipe", default=None, choices=sorted(RECIPES),
                     help="hold the implementation to this one recipe (default: every recipe)")


def pytest_configure(config: pytest.Config) -> None:
    profile = config.getoption("hypothesis_profile", None)
    if profile:
        settings.load_profile(profile)
    config._kvfp8_started = time.time()  # failure files newer than this are this run's
    try:  # a bad --impl is a usage error, said once, not a collection error per module
        config._kvfp8_impls = selected_implementations(config.getoption("impl"))
    except (ValueError, ImportError, OSError, SyntaxError) as exc:
        raise pytest.UsageError(f"--impl / ${IMPL_ENV}: {type(exc).__name__}: {exc}") from exc


def pytest_report_header(config: pytest.Config) -> list[str]:
    impls = ", ".join(i.name for i in config._kvfp8_impls)
    return [f"kvfp8: backend {describe()}; hypothesis profile {settings().max_examples} examples "
            f"({settings._current_profile}); database {DATABASE_DIR if settings().database else 'off'}",
            f"kvfp8: implementations {impls}; recipes {config.getoption('recipe') or 'all'}; "
            f"failure files in {failures_dir()}"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        impls = metafunc.config._kvfp8_impls
        metafunc.parametrize("impl", impls, ids=[i.name for i in impls])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """List the failure files this run wrote (by xdist workers too), with the replay command."""
    folder = failures_dir()
    started = getattr(config, "_kvfp8_started", time.time())
    new = sorted(p for p in folder.glob("*.json") if p.stat().st_mtime >= started - 1) if folder.is_dir() else []
    if new:
        terminalreporter.section("kvfp8 failure cases (replay: python -m tools.repro FILE)")
        for path in new:
            terminalreporter.write_line(f"python -m tools.repro {path}")


@pytest.fixture(scope="session")
def device():
    return test_device()


@pytest.fixture(scope="session")
def recipes(pytestconfig: pytest.Config) -> tuple[str, ...] | None:
    chosen = pytestconfig.getoption("recipe")
    return (chosen,) if chosen else None
