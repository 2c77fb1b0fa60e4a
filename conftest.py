"""Suite-wide setup: the backend (before triton is imported), Hypothesis profiles, --impl/--recipe.

Profiles (choose with --hypothesis-profile=NAME or $HYPOTHESIS_PROFILE):
  dev       few examples, fast local iteration (the default outside CI)
  ci        CPU CI under the interpreter: derandomized, bounded to fit 15 minutes on 2 cores
  gpu       CUDA runners: many more examples, still derandomized so a red run replays
  thorough  long exploratory runs, randomized, with the example database
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.impls import selected_implementations, test_device
from kernel.backend import describe

DATABASE = DirectoryBasedExampleDatabase(os.environ.get("KVFP8_HYPOTHESIS_DB", ".hypothesis/examples"))
_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, database=DATABASE, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **_common)
settings.register_profile("gpu", max_examples=300, database=DATABASE, **_common)
settings.register_profile("thorough", max_examples=3000, database=DATABASE, **_common)


def _default_profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    if test_device().type == "cuda":
        return "gpu"
    return "ci" if os.environ.get("CI") else "dev"


settings.load_profile(_default_profile())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", default=None,
                     help="module:function or path/to/file.py:function to test instead of the fused kernel "
                          "(also $KVFP8_IMPL)")
    parser.addoption("--recipe", default=None,
                     help="hold the implementation to this one recipe (default: every recipe)")


def pytest_configure(config: pytest.Config) -> None:
    profile = config.getoption("hypothesis_profile", None)
    if profile:
        settings.load_profile(profile)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"kvfp8: backend {describe()}; hypothesis profile {settings().max_examples} examples "
            f"({settings._current_profile})"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        impls = selected_implementations(metafunc.config.getoption("impl"))
        metafunc.parametrize("impl", impls, ids=[i.name for i in impls])


@pytest.fixture(scope="session")
def device():
    return test_device()


@pytest.fixture(scope="session")
def recipes(pytestconfig: pytest.Config) -> tuple[str, ...] | None:
    chosen = pytestconfig.getoption("recipe")
    return (chosen,) if chosen else None
